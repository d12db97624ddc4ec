"""What the attack tests share: the second user they attack as, and a small dataset with ids."""

from __future__ import annotations

import json
from pathlib import Path

#: Run a command as another local user (``nobody``), as a second user of a shared GPU box would.
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def data_file(tmp_path: Path, n: int = 4) -> Path:
    """``in.jsonl`` with ``n`` rows ``{"id": "pI", "prompt": "Say I."}``."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i}."}) + "\n" for i in range(n)))
    return path
