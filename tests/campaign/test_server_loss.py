"""The server dies mid-run and comes back: the run completes and no item is charged for the outage.

Two real cases with llama.cpp's llama-server (ready in a fraction of a second):
- an endpoint harvest does not manage is SIGKILLed and restarted on the same port by the test;
- a server harvest launched itself is SIGKILLed (its whole process group, found in the launch
  record): harvest relaunches it, verified stop first, and finishes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Status
from tests import engines
from tests.campaign.ledger_peek import attempts, results_count

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _data(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"Line {i}, go on."}) + "\n" for i in range(n)))
    return path


async def _wait_committed(run_dir: Path, at_least: int, task: asyncio.Task, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while results_count(run_dir) < at_least:
        assert not task.done(), "the run ended before the server could be killed"
        assert time.monotonic() < deadline, "no progress before the kill"
        await asyncio.sleep(0.05)


def test_unmanaged_endpoint_killed_and_restarted(tmp_path, llama_server_bin, tiny_gguf):
    port = engines.free_port()
    argv = engines.llama_argv(llama_server_bin, str(tiny_gguf), port)
    first = engines.start_engine(argv, port=port, model=str(tiny_gguf), log_path=tmp_path / "a.log",
                                 health="/health", timeout=60)
    second = None
    run_dir = tmp_path / "run"
    config = parse_config({
        "data": {"path": str(_data(tmp_path, 400)), "id_field": "id"},
        "sampling": {"max_tokens": 48},
        "client": {"endpoints": [first.url], "concurrency": 8, "health_deadline": 60, "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5}})

    async def scenario():
        nonlocal second
        task = asyncio.create_task(run_campaign(config))
        await _wait_committed(run_dir, 40, task)
        first.stop(grace=0)  # SIGKILL of the server's own process group (grace 0)
        await asyncio.sleep(2.0)
        second = await asyncio.to_thread(engines.start_engine, argv, port=port, model=str(tiny_gguf),
                                         log_path=tmp_path / "b.log", health="/health", timeout=60)
        return await asyncio.wait_for(task, timeout=300)

    try:
        report = asyncio.run(scenario())
    finally:
        first.stop(grace=0)
        if second is not None:
            second.stop()
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    assert report.totals.counts[Status.FAILED] == 0
    # max_retries = 0: any charged failure would have failed its item. Every item paid one attempt.
    assert set(attempts(run_dir)) == {1}


def test_managed_server_killed_is_relaunched(tmp_path, llama_server_bin, tiny_gguf):
    run_dir = tmp_path / "run"
    port = engines.free_port()
    config = parse_config({
        "server": {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin], "port": port,
                   "max_running_requests": 8, "extra_args": ["-c", "16384"], "ready_timeout": 60,
                   "stop_grace": 3, "stop_deadline": 20},
        "preflight": {"min_disk_free_gib": 0.1, "ram_reserve_gib": 0},
        "data": {"path": str(_data(tmp_path, 400)), "id_field": "id"},
        "sampling": {"max_tokens": 48},
        "client": {"concurrency": 8, "health_deadline": 60, "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5}})

    async def scenario():
        task = asyncio.create_task(run_campaign(config))
        await _wait_committed(run_dir, 40, task)
        record = json.loads((run_dir / "server" / "launch.json").read_text())
        os.killpg(record["record"]["pgid"], signal.SIGKILL)
        return await asyncio.wait_for(task, timeout=300)

    report = asyncio.run(scenario())
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    assert report.relaunches == 1
    assert report.stop_reports and all(r.clean for r in report.stop_reports), [r.to_dict() for r in report.stop_reports]
    assert set(attempts(run_dir)) == {1}
