"""kill -9 of `harvest run` at random moments, each followed by a resume: nothing lost, nothing twice.

The run talks to the shared real vLLM CPU server; the ledger is a real SQLite file. The kills land
anywhere: during start-up, ingest, dispatch and inside ledger commits. Every process killed here is
the `harvest run` this test started, signalled by its own pid.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.campaign.ledger_peek import orphan_results, results_count, unique_items

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ROUNDS = 20


def test_sigkill_at_random_moments_then_resume(tmp_path, vllm_server):
    n = 3000
    rows = [json.dumps({"id": f"k{i}", "prompt": f"Write a line about the number {i}."}) for i in range(n)]
    rows += [json.dumps({"id": "k7", "prompt": "Write a line about the number 7."})] * 5  # duplicates
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(rows) + "\n")
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(
        f'[data]\npath = "{data}"\nid_field = "id"\n'
        f'[sampling]\nmax_tokens = 24\n'
        f'[client]\nendpoints = ["{vllm_server.url}"]\nconcurrency = 32\nhealth_deadline = 60\n'
        f'[output]\ndir = "{run_dir}"\n'
        f'[run]\nprogress_interval = 0.5\n')
    argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    rng = random.Random(1234)
    seen_results = 0
    kills = 0
    rounds = 0
    while kills < ROUNDS and rounds < 2 * ROUNDS:
        rounds += 1
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.4, 2.5))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
        results = results_count(run_dir)
        assert orphan_results(run_dir) == 0, "a committed result belongs to an item that is not done"
        assert results >= seen_results, f"committed results went from {seen_results} to {results}"
        seen_results = results
    assert kills >= ROUNDS, f"only {kills} of {rounds} rounds were killed mid-run"

    final = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stdout + final.stderr
    assert orphan_results(run_dir) == 0
    assert results_count(run_dir) == n  # one result per unique input item, none lost, none twice
    assert unique_items(run_dir) == n

    status = subprocess.run([sys.executable, "-m", "harvest", "status", str(run_dir), "--json"],
                            capture_output=True, text=True, timeout=60)
    if status.returncode == 0:  # `harvest status` counts add up to the input too
        counts = json.loads(status.stdout)["counts"]
        assert sum(counts.values()) == n
