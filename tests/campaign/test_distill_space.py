"""Disk planning for logprobs: the estimate, and a run refused before anything is sent when the
output's file system cannot hold it (real free space, real numbers)."""

from __future__ import annotations

import json
import shutil
import sys

from harvest.campaign.run.distill import describe_samples, logprob_space
from harvest.config import parse_config
from harvest.dataset import iter_items
from harvest.ledger import Ledger, prepare_ingest
from harvest.ledger.logprobs import record_bytes
from tests import harvest_process


def _config(tmp_path, *, max_tokens, n, logprobs=20, rows=50, turns=1):
    data = tmp_path / "in.jsonl"
    with open(data, "w") as f:
        for i in range(rows):
            if turns == 1:
                f.write(json.dumps({"id": f"r{i}", "prompt": f"question {i}"}) + "\n")
            else:
                msgs = []
                for t in range(turns):
                    msgs += [{"role": "user", "content": f"q{i}.{t}"}, {"role": "assistant", "content": "a"}]
                f.write(json.dumps({"id": f"r{i}", "messages": msgs}) + "\n")
    return parse_config({
        "data": {"path": str(data), "id_field": "id"},
        "sampling": {"max_tokens": max_tokens, "n": n, "logprobs": logprobs},
        "client": {"endpoints": ["http://127.0.0.1:9"]},
        "output": {"dir": str(tmp_path / "run")},
    }, "job.toml")


def test_estimate_counts_samples_turns_and_tokens(tmp_path):
    config = _config(tmp_path, max_tokens=100, n=3, rows=50, turns=2)
    with Ledger.open(config.output.dir, settings_hash="h", samples=3) as ledger:
        batch = prepare_ingest(iter_items(config.data), 10_000, 3)
        report = ledger.commit_ingest(batch)
        check = logprob_space(config, ledger, batch, report)
    assert check.numbers["needed"] == 150 * record_bytes(200, 20, 2)  # 50 inputs x 3 samples, 2 turns x 100 tokens
    assert check.passed and abs(check.numbers["free"] - shutil.disk_usage(tmp_path).free) < 2**30  # a shared disk moves
    assert "150 samples still to generate" in check.detail and "126 B/token at top-20" in check.detail


def test_run_refused_when_logprobs_cannot_fit(tmp_path):
    config = _config(tmp_path, max_tokens=1_000_000_000, n=64, rows=200)  # ~10^15 bytes
    job = tmp_path / "job.toml"
    job.write_text(
        f'[data]\npath = "{config.data.path}"\nid_field = "id"\n'
        '[sampling]\nmax_tokens = 1000000000\nn = 64\nlogprobs = 20\n'
        '[client]\nendpoints = ["http://127.0.0.1:9"]\nhealth_deadline = 5\n'
        f'[output]\ndir = "{tmp_path / "run"}"\n')
    done = harvest_process.run([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], capture_output=True,
                               text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "logprob_disk" in done.stderr and "GiB free" in done.stderr
    assert "12,800 samples still to generate" in done.stderr  # 200 inputs x 64
    with Ledger.open_readonly(tmp_path / "run") as ledger:
        assert ledger.check_totals().results == 0


def test_start_line_says_how_samples_are_asked(tmp_path):
    config = _config(tmp_path, max_tokens=8, n=4)
    line = describe_samples(config)
    assert "4 separate requests with distinct random seeds" in line and "unknown" in line
    assert "temperature 0" in line and "top-20 logprobs" in line
