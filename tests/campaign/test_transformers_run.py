"""A managed ``transformers serve`` campaign on the CPU, as the GPU check runs it on a GPU: ``harvest
run`` launches the engine through its adapter (``engine = "transformers"``), waits for readiness,
passes the start check, sends 100 items and one prompt larger than the model's context; the client is
SIGKILLed mid-run and the same command resumes it.

Checked: every item exactly once in the ledger, with its own id; the oversized prompt skipped with
its length and the limit, never sent; the first server, left running by the killed client, stopped
by its launch record; the second stopped clean at the end. The engine's hub cache holds another
model, which this version lists at ``GET /v1/models`` instead of the one it serves (docs/engines.md):
the run must ask for the model it launched. Every process signalled here is the ``harvest run`` this
test started, by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.ledger import Ledger, Status
from tests import harvest_process
from tests.campaign.ledger_peek import orphan_results, result_ids, results_count
from tests.engines import free_port
from tests.hf_cache import cache_other_model

pytestmark = pytest.mark.slow

ITEMS = 100
KILL_AT = 20  # of 100: the kill lands mid-run (8 in flight)
HUGE_BYTES = 200_000


def write_job(tmp_path: Path, model: Path, python: str) -> Path:
    rows = [{"qid": f"q{i:04d}", "question": f"Write about topic {i}."} for i in range(ITEMS)]
    rows.insert(ITEMS // 2, {"qid": "huge", "question": "lorem ipsum dolor sit amet " * (HUGE_BYTES // 27)})
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tables = {
        "server": {"engine": "transformers", "model": str(model), "python": python, "port": free_port(),
                   "ready_timeout": 300, "stop_grace": 15, "stop_deadline": 60,
                   # On the CPU its paged cache takes this share of the host's RAM (most of it by default).
                   "gpu_memory_utilization": 0.02},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(data), "id_field": "qid", "prompt_field": "question"},
        "sampling": {"max_tokens": 16},
        "client": {"concurrency": 8, "request_timeout": 120},
        "output": {"dir": str(tmp_path / "run")},
    }
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    job = tmp_path / "job.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


def launch_record(run_dir: Path) -> tuple[int, float]:
    record = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
    return int(record["pid"]), float(record["create_time"])


def alive(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_managed_transformers_campaign_killed_and_resumed_exactly_once(tmp_path, transformers_python, tiny_model):
    job = write_job(tmp_path, tiny_model, transformers_python)
    run_dir = tmp_path / "run"
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200",
           "HF_HUB_CACHE": str(cache_other_model(tmp_path / "hub"))}
    argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    with open(tmp_path / "first.log", "w") as log:
        first = harvest_process.popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed_at = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and first.poll() is None:
            done = results_count(run_dir)
            if done >= KILL_AT:
                os.kill(first.pid, signal.SIGKILL)  # the client this test started, by its pid
                killed_at = done
                break
            time.sleep(0.05)
    finally:
        if first.poll() is None and killed_at is None:
            first.kill()
        first.wait(timeout=60)
    log_text = (tmp_path / "first.log").read_text()
    assert killed_at is not None and killed_at < ITEMS, (killed_at, first.returncode, log_text[-3000:])
    leftover = launch_record(run_dir)
    assert alive(*leftover), "the killed client's server should outlive it (its own session)"

    resumed = harvest_process.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert not alive(*leftover), "the leftover server was not stopped by its record"
    second = launch_record(run_dir)
    assert second != leftover and not alive(*second)

    assert sorted(result_ids(run_dir)) == [f"q{i:04d}" for i in range(ITEMS)]  # every item once, its own id
    assert orphan_results(run_dir) == 0
    ledger = Ledger.open_readonly(run_dir)
    try:
        huge = ledger.get("huge")
    finally:
        ledger.close()
    assert huge is not None and huge.status is Status.SKIPPED and huge.attempts == 0
    assert huge.error_class == "context_length"
    assert "does not fit the model's context of 4096 tokens" in huge.last_error, huge.last_error
    timeline = json.loads((run_dir / "timeline.json").read_text())
    stop = timeline["launches"][-1]["stop"]
    assert stop is not None and stop.get("clean", stop.get("verdict") == "clean"), stop
