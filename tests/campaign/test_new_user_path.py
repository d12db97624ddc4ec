"""A new user's first job, on a real llama-server, as the README and docs/ lead there: the
server is started the usual way, ``llama-server -m models/tiny.gguf`` (so it serves the model under
that name, a file of that name lying in the folder); the first run names the model wrongly; the
fix goes into the same ``--out``; the run then goes through with no refusal (the model name sent as
typed, not made a path; the folder the failed try left takes the fixed job) and every item is
answered exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import engines, harvest_process
from tests.campaign import ledger_peek

ROWS = 24


def harvest(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *argv, "--no-live"], cwd=cwd, capture_output=True,
                               text=True, timeout=300, stdin=subprocess.DEVNULL,
                               env={**os.environ, "HARVEST_STATE_DIR": str(cwd / "state")})


def test_a_wrong_model_name_then_the_fix_in_the_same_out_then_every_item_once(tmp_path, monkeypatch,
                                                                            llama_server_bin, tiny_gguf):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").symlink_to(tiny_gguf)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Count to {i}."}) + "\n"
                                                    for i in range(ROWS)))
    monkeypatch.chdir(tmp_path)  # llama-server runs here, on the relative path, as a user starts it
    port = engines.free_port()
    server = engines.start_engine(engines.llama_argv(llama_server_bin, "models/tiny.gguf", port), port=port,
                                  model="models/tiny.gguf", log_path=tmp_path / "llama.log", health="/health",
                                  timeout=60)
    try:
        job = ["run", "--engine", "openai", "--base-url", server.url + "/v1", "--data", "prompts.jsonl",
               "--max-tokens", "8", "--out", "runs/first"]
        wrong = harvest(tmp_path, *job, "--model", "tiny")
        assert wrong.returncode == 2, wrong.stdout + wrong.stderr
        assert "'tiny' is not served by" in wrong.stderr and "it serves 'models/tiny.gguf'" in wrong.stderr, \
            wrong.stderr
        fixed = harvest(tmp_path, *job, "--model", "models/tiny.gguf")
        said = fixed.stdout + fixed.stderr
        assert fixed.returncode == 0, said
        assert "belongs to another job" not in said and "is not served" not in said, said
        assert "runs/first held no results (an earlier attempt left 24 pending): it takes this job's settings" \
            in said, said
        assert "resuming" not in said, said
    finally:
        server.stop()
    statuses = ledger_peek.statuses(tmp_path / "runs" / "first")
    assert statuses.get("done", 0) + statuses.get("truncated", 0) == ROWS and set(statuses) <= {"done", "truncated"}
    ids = ledger_peek.result_ids(tmp_path / "runs" / "first")
    assert sorted(ids) == sorted(f"q{i}" for i in range(ROWS)), ids  # each item answered, each once
