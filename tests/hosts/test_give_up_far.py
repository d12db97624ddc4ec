"""Where the far path gives up, over a real sshd:

- A tunnel that never comes back: its sshd is gone and the ssh client carrying it is killed; the
  tunnel tries for ``reopen_deadline`` and then gives up with a RemoteError naming the host and
  the step, inside its budget, leaving no ssh client and no listener behind.
- Far leftovers after a killed ``[host]`` run: the near `harvest run` is SIGKILLed mid-run (its far
  server, detached and supervised there, keeps running); the resumed run stops that far server by
  its near record first (one line says so), launches a fresh one and finishes: every item once,
  nothing failed or charged twice, and no process of the killed session left (far engine, far
  supervisor, near tunnel client).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.config import HostConfig
from harvest.errors import RemoteError
from harvest.net import port_listening
from harvest.placement.record import read as read_remote_record
from harvest.placement.ssh.tunnel import REOPEN_DELAY, Tunnel
from tests import engines, harvest_process
from tests.campaign.ledger_peek import attempts, results_count, statuses, unique_items
from tests.hosts.conftest import write_toml
from tests.hosts.test_container import PREFLIGHT, server_table
from tests.hosts.test_tunnel import echo_server, roundtrip

#: Seconds a give-up may overrun its own budget on a loaded 2-core machine.
MARGIN = 10.0


def ssh_children() -> list[psutil.Process]:
    """ssh client processes descended from this test process (the tunnel's, when one is left)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name() == "ssh" and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_tunnel_that_never_comes_back_gives_up_inside_its_deadline(sshd):
    srv, far_port = echo_server()
    connect_timeout, reopen_deadline = 2.0, 3.0
    host = HostConfig.model_validate(sshd.host_table(exec_prefix=[], connect_timeout=connect_timeout))
    tunnel = Tunnel(host, far_port, reopen_deadline=reopen_deadline)
    try:
        local = tunnel.open()
        assert roundtrip(local) == b"echo:ping"
        first = tunnel.pid
        sshd.stop()  # the test's own sshd: nothing answers on its port any more
        psutil.Process(first).send_signal(signal.SIGKILL)  # the client harvest started and recorded
        t = time.monotonic()
        budget = REOPEN_DELAY + reopen_deadline + connect_timeout + 5.0 + MARGIN
        while tunnel.error is None and time.monotonic() - t < budget:
            time.sleep(0.1)
        took = time.monotonic() - t
        assert isinstance(tunnel.error, RemoteError), f"no give-up within {budget:.0f} s"
        assert took >= reopen_deadline, f"gave up after {took:.1f} s, before its reopen_deadline"
        text = str(tunnel.error)
        assert f"127.0.0.1:{sshd.port}" in text and "tunnel reopen" in text, text
        assert tunnel.reopens == 0 and not tunnel.alive()
        assert not port_listening("127.0.0.1", local, timeout=1.0), "the local end still listens"
        assert ssh_children() == [], "an ssh client of the tunnel is left"
    finally:
        tunnel.close()
        srv.close()


def far_job(tmp_path: Path, sshd, llama_server_bin: str, tiny_gguf: Path, n: int) -> Path:
    data = tmp_path / "in.jsonl"
    rows = (json.dumps({"id": f"k{i}", "prompt": f"Killed {i}, go on."}) for i in range(n))
    data.write_text("".join(r + "\n" for r in rows))
    return write_toml(tmp_path / "job.toml", {
        "server": server_table(llama_server_bin, tiny_gguf, engines.free_port()), "preflight": PREFLIGHT,
        "data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 16},
        "client": {"concurrency": 4, "max_retries": 0, "health_deadline": 120},
        "output": {"dir": str(tmp_path / "run")}, "run": {"progress_interval": 0.5},
        "host": sshd.host_table()})


def alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.engine
@pytest.mark.slow
def test_far_leftovers_of_a_killed_run_are_stopped_when_it_resumes(tmp_path, sshd, llama_server_bin,
                                                                    tiny_gguf):
    n = 60
    job = far_job(tmp_path, sshd, llama_server_bin, tiny_gguf, n)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "near-state")}
    first = harvest_process.popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        record = None
        while record is None or results_count(run_dir) < 10:
            assert first.poll() is None, "the first session ended before the kill"
            assert time.monotonic() < deadline, f"no progress within 300 s: {record}"
            if record is None:  # ready, with the tunnel the answers come back through
                seen = read_remote_record(run_dir / "server")
                record = seen if seen is not None and seen.get("status") == "ready" and "tunnel" in seen else None
            time.sleep(0.02)
        # The far engine this test's run started is frozen before the kill, so the run cannot
        # finish first on a fast machine; it goes on before the resume.
        far_leader = psutil.Process(int(record["far_pid"]))
        held = [far_leader, *far_leader.children(recursive=True)]
        for p in held:
            p.suspend()
        # The far server and the near tunnel client of this session, measured before the kill.
        tunnel_client = psutil.Process(int(record["tunnel"]["ssh_pid"]))
        leftovers = [(p.pid, p.create_time()) for p in (*held, tunnel_client)]
        assert results_count(run_dir) < n, "the run finished before its kill"
        first.send_signal(signal.SIGKILL)  # the near harvest this test started, mid-run
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
        for p in held:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
    assert alive(far_leader.pid, leftovers[0][1]), "the far server died with the near run: nothing left over"

    resumed = harvest_process.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-4000:]
    assert "stopped the far server left running by an earlier session on" in out, out[-4000:]
    assert ": clean" in out, out[-4000:]
    assert f"ended the tunnel (ssh pid {tunnel_client.pid}) left by an earlier session" in out, out[-4000:]
    left = [pid for pid, ct in leftovers if alive(pid, ct)]
    assert left == [], f"processes of the killed session still running: {left}"
    counts = statuses(run_dir)
    assert counts == {"done": n} or set(counts) <= {"done", "truncated"}, counts
    assert results_count(run_dir) == n == unique_items(run_dir)
    assert set(attempts(run_dir)) == {1}  # max_retries 0: a charged failure would have failed its item
    final = read_remote_record(run_dir / "server")
    assert final is not None and final["status"] == "stopped" and final["far_pid"] != far_leader.pid
