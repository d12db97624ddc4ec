"""A dataset path that cannot be read stops `harvest run` before anything exists: no run folder,
no ledger, no state, so the next run with the right path starts fresh instead of "resuming: 0 done".
The message names the file, the field and where a relative path is read from."""

from __future__ import annotations

import os
import sys
from tests import harvest_process


def test_a_missing_data_file_leaves_no_run_folder(tmp_path):
    (tmp_path / "job.toml").write_text('[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:9"\n'
                                       'model = "m"\n[data]\npath = "prompts.jsonl"\n[output]\ndir = "runs/a"\n')
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    out = harvest_process.run([sys.executable, "-m", "harvest", "run", "job.toml", "--no-live"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert (f"job.toml [data] path: cannot read {tmp_path / 'prompts.jsonl'}: No such file or directory; "
            f"nothing was created (a relative path in a job file is read from the file's folder, one given as a "
            f"flag or a keyword from the folder harvest runs in)") in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]  # no runs/, no state dir
