"""R2: the engine's whole process group SIGKILLed five times during one run -> the run completes.

- harvest manages the server (llama-server through engine "llamacpp"): each death is seen, the dead
  server gets its verified stop and is relaunched (``run.max_relaunches = 5``);
- harvest only uses the endpoint: the test restarts it on the same port after each kill and
  harvest waits for it.

In both, no item is failed or charged for the outages: ``max_retries = 0``, so a single charged
attempt beyond the first would fail its item. tests/campaign/test_server_loss.py kills once; this
file kills five times in one run. Every process signalled is one the test's run launched (found
in the launch record, verified by create time) or one the test started itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import psutil
import pytest

from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Status
from tests import engines
from tests.chaos.killer import committed, write_data

pytestmark = [pytest.mark.engine, pytest.mark.slow]

DEATHS = 5
BETWEEN = 60  # results committed between two deaths


def _attempts(run_dir: Path) -> set[int]:
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return {r[0] for r in conn.execute("SELECT attempts FROM items WHERE status != 'skipped'")}
    finally:
        conn.close()


async def _wait(predicate, task: asyncio.Task, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert not task.done(), f"the run ended while waiting for {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _ready_engine(run_dir: Path, not_pid: int | None) -> psutil.Process | None:
    """The engine of the current launch record once it is ready (and not ``not_pid``), verified."""
    try:
        state = json.loads((run_dir / "server" / "launch.json").read_text())
    except (OSError, ValueError):
        return None
    rec = state["record"]
    if state["status"] != "ready" or rec["pid"] == not_pid:
        return None
    try:
        p = psutil.Process(rec["pid"])
        if abs(p.create_time() - rec["create_time"]) > 0.05 or rec["pgid"] != rec["pid"]:
            return None
        return p
    except psutil.NoSuchProcess:
        return None


def test_managed_server_group_killed_five_times_is_relaunched_each_time(tmp_path, llama_server_bin,
                                                                        tiny_gguf):
    run_dir = tmp_path / "run"
    n = (DEATHS + 2) * BETWEEN  # the deaths, then two stretches of work to finish
    config = parse_config({
        "server": {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin],
                   "port": engines.free_port(), "max_running_requests": 8, "extra_args": ["-c", "16384"],
                   "ready_timeout": 60, "stop_grace": 3, "stop_deadline": 20},
        "preflight": {"min_disk_free_gib": 0.1, "ram_reserve_gib": 0},
        "data": {"path": str(write_data(tmp_path / "in.jsonl", n, duplicates=0)), "id_field": "id"},
        "sampling": {"max_tokens": 16},
        "client": {"concurrency": 8, "health_deadline": 60, "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5, "max_relaunches": DEATHS}})
    killed: list[int] = []

    async def scenario():
        task = asyncio.create_task(run_campaign(config))
        for i in range(DEATHS):
            goal = (i + 1) * BETWEEN
            await _wait(lambda goal=goal: committed(run_dir) >= goal, task, f"{goal} results")
            engine = None

            def ready() -> bool:
                nonlocal engine
                engine = _ready_engine(run_dir, killed[-1] if killed else None)
                return engine is not None

            await _wait(ready, task, f"relaunch {i}")
            os.killpg(engine.pid, signal.SIGKILL)  # the group of the server our run launched (pgid == pid)
            killed.append(engine.pid)
        return await asyncio.wait_for(task, timeout=300)

    report = asyncio.run(scenario())

    assert len(killed) == DEATHS
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    assert report.relaunches == DEATHS
    assert report.totals.counts[Status.FAILED] == 0
    assert _attempts(run_dir) == {1}  # nobody paid for the outages
    # One verified stop per death plus the last one, all clean; every killed engine is gone.
    assert len(report.stop_reports) == DEATHS + 1
    assert all(r.clean for r in report.stop_reports), [r.problems for r in report.stop_reports]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in killed)


def test_unmanaged_endpoint_killed_five_times_and_restarted_is_waited_for(tmp_path, llama_server_bin,
                                                                          tiny_gguf):
    port = engines.free_port()
    argv = engines.llama_argv(llama_server_bin, str(tiny_gguf), port)
    run_dir = tmp_path / "run"
    n = (DEATHS + 2) * BETWEEN  # the deaths, then two stretches of work to finish
    config = parse_config({
        "data": {"path": str(write_data(tmp_path / "in.jsonl", n, duplicates=0)), "id_field": "id"},
        "sampling": {"max_tokens": 16},
        "client": {"endpoints": [f"http://127.0.0.1:{port}"], "concurrency": 8, "health_deadline": 60,
                   "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5}})
    servers = [engines.start_engine(argv, port=port, model=str(tiny_gguf), log_path=tmp_path / "s0.log",
                                    health="/health", timeout=60)]

    async def scenario():
        task = asyncio.create_task(run_campaign(config))
        for i in range(DEATHS):
            goal = (i + 1) * BETWEEN
            await _wait(lambda goal=goal: committed(run_dir) >= goal, task, f"{goal} results")
            servers[-1].stop(grace=0)  # SIGKILL of the group of the server this test started
            await asyncio.sleep(1.0)
            servers.append(await asyncio.to_thread(
                engines.start_engine, argv, port=port, model=str(tiny_gguf),
                log_path=tmp_path / f"s{i + 1}.log", health="/health", timeout=60))
        return await asyncio.wait_for(task, timeout=300)

    try:
        report = asyncio.run(scenario())
    finally:
        for s in servers:
            s.stop(grace=0)
    assert len(servers) == DEATHS + 1
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    assert report.totals.counts[Status.FAILED] == 0
    assert _attempts(run_dir) == {1}
