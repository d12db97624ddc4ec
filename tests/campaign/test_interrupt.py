"""Ctrl-C (SIGINT) and SIGTERM stop `harvest run` cleanly: exit 130, nothing left running, resumable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import harvest_process
from tests.campaign import ledger_peek

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_signal_stops_cleanly_and_the_run_resumes(tmp_path, llama_server, sig):
    n = 300
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"Count to {i}."}) + "\n" for i in range(n)))
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 32\n'
                   f'[client]\nendpoints = ["{llama_server.url}"]\nconcurrency = 8\n'
                   f'[output]\ndir = "{run_dir}"\n')
    argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    proc = harvest_process.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while ledger_peek.results_count(run_dir) < 20:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "no results within 60 s"
        time.sleep(0.05)
    proc.send_signal(sig)  # the harvest process this test started
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    statuses = ledger_peek.statuses(run_dir)
    assert statuses.get("running", 0) == 0, statuses  # in-flight items were released, not left running
    assert statuses.get("pending", 0) > 0, "the signal came too late to interrupt anything"
    assert ledger_peek.results_count(run_dir) == statuses.get("done", 0) + statuses.get("truncated", 0)

    final = harvest_process.run(argv, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout + final.stderr
    statuses = ledger_peek.statuses(run_dir)
    assert statuses.get("truncated", 0) + statuses.get("done", 0) == n
    assert ledger_peek.results_count(run_dir) == n
