"""A "container" on the far box: a PID and mount namespace made with ``unshare --pid --fork
--mount-proc``, entered through an ``nsenter`` exec prefix over real OpenSSH, so far pids differ
from near ones. serve, run and stop go through it; the stop is verified inside (by the far
harvest); and the near side never signals anything but the ssh clients it started itself."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from tests.placed import run_campaign
from harvest.placement.ssh.servers import read_remote_record
from harvest.cli.main import cli
from harvest.config import load_config
from harvest.net import listening_pids, port_listening
from tests import engines
from tests.campaign.ledger_peek import attempts
from tests.hosts.conftest import write_toml
from tests.realparts import require

pytestmark = [pytest.mark.engine]


#: The container's init: like a real one, it reaps the orphans the namespace hands it.
REAPER = """
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


@pytest.fixture
def container():
    """(near pid of the namespace's init, its pid-namespace link); the namespace ends with its init."""
    require("unshare", "the container is a pid namespace made by unshare, entered by nsenter")
    require("root", "unshare --pid needs root")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REAPER],
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        init = None
        while init is None and time.monotonic() < deadline:
            kids = psutil.Process(proc.pid).children()
            init = kids[0] if kids else None
            time.sleep(0.05)
        assert init is not None, "unshare made no namespace init"
        yield init.pid, os.readlink(f"/proc/{init.pid}/ns/pid")
    finally:
        # Our own unshare and its child, the namespace's init (same group): when init goes, the
        # kernel ends everything left in the namespace.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class SignalLog:
    """Every os.kill / os.killpg of this process (psutil and subprocess go through them), with what
    the target was: its argv and its pid namespace."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.sent: list[tuple[int, int, list[str], str]] = []
        real_kill, real_killpg = os.kill, os.killpg

        def look(pid: int) -> tuple[list[str], str]:
            try:
                return psutil.Process(pid).cmdline(), os.readlink(f"/proc/{pid}/ns/pid")
            except (psutil.Error, OSError):
                return [], ""

        def kill(pid: int, sig: int) -> None:
            if sig != 0:
                self.sent.append((pid, sig, *look(pid)))
            real_kill(pid, sig)

        def killpg(pgid: int, sig: int) -> None:
            if sig != 0:
                self.sent.append((pgid, sig, *look(pgid)))
            real_killpg(pgid, sig)

        monkeypatch.setattr(os, "kill", kill)
        monkeypatch.setattr(os, "killpg", killpg)


def server_table(llama_server_bin: str, tiny_gguf: Path, port: int) -> dict[str, object]:
    return {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin], "port": port,
            "max_running_requests": 4, "extra_args": ["-c", "4096"], "ready_timeout": 120,
            "stop_grace": 3, "stop_deadline": 30}


PREFLIGHT = {"min_disk_free_gib": 0.1, "ram_reserve_gib": 0}


def test_serve_run_stop_inside_a_container(tmp_path, sshd, container, llama_server_bin, tiny_gguf, monkeypatch):
    init_pid, ns = container
    sshd.extra_prefix = ["nsenter", "-t", str(init_pid), "-p", "-m", "--"]
    signals = SignalLog(monkeypatch)
    runner = CliRunner()

    # serve --detach inside the container, through ssh + nsenter.
    port = engines.free_port()
    box = write_toml(tmp_path / "box.toml", {"server": server_table(llama_server_bin, tiny_gguf, port),
                                              "preflight": PREFLIGHT, "host": sshd.host_table()})
    near = tmp_path / "near"
    res = runner.invoke(cli, ["serve", str(box), "--detach", "--run-dir", str(near)])
    assert res.exit_code == 0, res.output
    record = read_remote_record(near)
    assert record is not None
    holders = listening_pids(port)
    assert len(holders) == 1
    engine_near_pid = holders[0]
    assert os.readlink(f"/proc/{engine_near_pid}/ns/pid") == ns  # it runs in the container
    assert record["far_pid"] != engine_near_pid  # the far harvest saw it under the container's own pid
    res = runner.invoke(cli, ["stop", str(near), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["verdict"] == "clean"
    # Verified inside: the far harvest's own record of the stop, next to the engine it stopped.
    assert json.loads((Path(record["far_run_dir"]) / "stop.json").read_text())["verdict"] == "clean"
    assert not psutil.pid_exists(engine_near_pid) and not port_listening("127.0.0.1", port)

    # A whole run through the container: launch there, generate through the tunnel, stop there.
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"Inside {i}."}) + "\n" for i in range(30)))
    job = write_toml(tmp_path / "job.toml", {
        "server": server_table(llama_server_bin, tiny_gguf, engines.free_port()), "preflight": PREFLIGHT,
        "data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 8},
        "client": {"concurrency": 4, "max_retries": 0, "health_deadline": 60},
        "output": {"dir": str(tmp_path / "run")}, "host": sshd.host_table()})
    report = asyncio.run(run_campaign(load_config(job)))
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    assert report.stop_reports and all(r.clean for r in report.stop_reports)
    assert set(attempts(tmp_path / "run")) == {1}

    # The near side signalled only ssh clients it started (closing tunnels), none in the container.
    assert signals.sent, "the tunnels were never closed"
    for pid, sig, argv, their_ns in signals.sent:
        assert argv and os.path.basename(argv[0]) == "ssh", (pid, sig, argv)
        assert their_ns != ns, (pid, sig, argv)
