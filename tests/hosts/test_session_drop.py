"""A dropped SSH session mid-run is a sick server, not a failed item: the ssh client carrying the
tunnel is killed (by the pid harvest recorded), or separately the far sshd's child for that
session; the tunnel is reopened on the same local port, the far server (detached, supervised
there) is found again by its record, and the run completes: nothing lost or duplicated, no attempt
charged (max_retries = 0: a charged failure would fail its item)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.placed import run_campaign
from harvest.placement.ssh.servers import read_remote_record
from harvest.config import load_config
from harvest.ledger import Status
from tests import engines
from tests.campaign.ledger_peek import attempts, results_count, unique_items
from tests.hosts.conftest import write_toml
from tests.hosts.test_container import PREFLIGHT, server_table

pytestmark = [pytest.mark.engine, pytest.mark.slow]

N = 120  # 30 committed before the drop, 90 after it: the tunnel is gone until it is reopened


def job(tmp_path: Path, sshd, llama_server_bin: str, tiny_gguf: Path) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"d{i}", "prompt": f"Dropped {i}, go on."}) + "\n"
                            for i in range(N)))
    return write_toml(tmp_path / "job.toml", {
        "server": server_table(llama_server_bin, tiny_gguf, engines.free_port()), "preflight": PREFLIGHT,
        "data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 32},
        "client": {"concurrency": 4, "max_retries": 0, "health_deadline": 120},
        "output": {"dir": str(tmp_path / "run")}, "run": {"progress_interval": 0.5},
        "host": sshd.host_table()})


def tunnel_pid(run_dir: Path, task: asyncio.Task) -> int:
    record = read_remote_record(run_dir / "server")
    assert record is not None and "tunnel" in record, "no tunnel recorded"
    return int(record["tunnel"]["ssh_pid"])


async def wait_committed(run_dir: Path, at_least: int, task: asyncio.Task, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while results_count(run_dir) < at_least:
        assert not task.done(), f"the run ended before the drop: {task.result() if not task.exception() else task.exception()}"
        assert time.monotonic() < deadline, "no progress before the drop"
        await asyncio.sleep(0.1)


def session_child(sshd, client_pid: int) -> psutil.Process:
    """The far sshd's child serving the ssh client ``client_pid`` (matched by the TCP ports)."""
    client_ports = {c.laddr.port for c in psutil.Process(client_pid).net_connections(kind="tcp")
                    if c.raddr and c.raddr.port == sshd.port}
    assert client_ports, "the tunnel's client has no connection to the sshd"
    for child in sshd.session_children():
        if any(c.raddr and c.raddr.port in client_ports for c in child.net_connections(kind="tcp")):
            return child
    raise AssertionError("no sshd session child for the tunnel")


def check(report, run_dir: Path) -> None:
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    assert report.totals.counts[Status.FAILED] == 0
    assert results_count(run_dir) == N == unique_items(run_dir)  # nothing lost, nothing twice
    assert set(attempts(run_dir)) == {1}  # no attempt charged for the drop
    assert report.stop_reports and all(r.clean for r in report.stop_reports)
    record = read_remote_record(run_dir / "server")
    assert record["tunnel"]["reopens"] >= 1 and record["status"] == "stopped"


@pytest.mark.parametrize("victim", ["ssh_client", "sshd_session_child"])
def test_dropped_session_mid_run(tmp_path, sshd, llama_server_bin, tiny_gguf, victim):
    run_dir = tmp_path / "run"
    config = load_config(job(tmp_path, sshd, llama_server_bin, tiny_gguf))

    async def scenario():
        task = asyncio.create_task(run_campaign(config))
        await wait_committed(run_dir, 30, task)
        pid = tunnel_pid(run_dir, task)
        client = psutil.Process(pid)
        assert os.path.basename(client.cmdline()[0]) == "ssh"
        if victim == "ssh_client":
            client.send_signal(signal.SIGKILL)
        else:
            child = session_child(sshd, pid)  # started by the test's own sshd
            child.send_signal(signal.SIGKILL)
        return await asyncio.wait_for(task, timeout=600)

    report = asyncio.run(scenario())
    check(report, run_dir)
