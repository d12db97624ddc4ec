"""A Hugging Face hub cache as huggingface_hub lays it out (blobs, a snapshot of links, refs/main),
holding one generative model: what ``transformers serve`` lists at ``GET /v1/models`` instead of the
model it serves (tests/server/test_transformers.py)."""

from __future__ import annotations

import json
from pathlib import Path

#: The id ``transformers serve`` lists for the cached model.
CACHED_ID = "acme/other-llm"


def cache_other_model(hub: Path) -> Path:
    """Lay ``acme/other-llm`` (a config.json naming a causal LM, no weights) into the hub cache ``hub``."""
    repo = hub / "models--acme--other-llm"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    blob = repo / "blobs" / "c0ffee"
    blob.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(blob)
    return hub
