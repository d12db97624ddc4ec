"""The placement matrix over real OpenSSH (tests/hosts/conftest.py): serve --detach + ps + stop of a
[host] job on a real engine (llama-server on the tiny model), on the box itself and inside a
container entered through an exec prefix; the documents in their documented shapes, the server's
pid seen on that box (inside the container: under the container's own pid namespace)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harvest.net import listening_pids
from tests import engines
from tests.hosts.conftest import write_toml
from tests.hosts.test_container import PREFLIGHT, container, server_table  # noqa: F401 - the fixture
from tests.placement.matrix import serve_ps_stop

pytestmark = [pytest.mark.engine]
HARVEST = str(Path(sys.executable).with_name("harvest"))


def runner(tmp_path: Path):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "near-state")}

    def harvest(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([HARVEST, *args], capture_output=True, text=True, timeout=400, env=env)

    return harvest


def test_serve_ps_stop_on_a_box(tmp_path, sshd, llama_server_bin, tiny_gguf):
    port = engines.free_port()
    box = write_toml(tmp_path / "box.toml", {"server": server_table(llama_server_bin, tiny_gguf, port),
                                              "preflight": PREFLIGHT, "host": sshd.host_table()})
    label = f"root@127.0.0.1:{sshd.port}"
    serve_ps_stop(runner(tmp_path), box, tmp_path / "runs" / "box", ps_args=("--config", str(box)),
                  expect_where=lambda w: w == label)
    assert (tmp_path / "runs" / "box" / "placement.json").exists()


def test_serve_ps_stop_in_a_container(tmp_path, sshd, container, llama_server_bin, tiny_gguf):  # noqa: F811
    init_pid, ns = container
    sshd.extra_prefix = ["nsenter", "-t", str(init_pid), "-p", "-m", "--"]
    port = engines.free_port()
    box = write_toml(tmp_path / "lxc.toml", {"server": server_table(llama_server_bin, tiny_gguf, port),
                                              "preflight": PREFLIGHT, "host": sshd.host_table()})

    def seen_here(far_pid: int) -> int:
        (pid,) = listening_pids(port)  # the engine as this machine sees it ...
        assert os.readlink(f"/proc/{pid}/ns/pid") == ns  # ... inside the container's namespace
        status = Path(f"/proc/{pid}/status").read_text()
        nspids = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        assert int(nspids[-1]) == far_pid, nspids  # the pid the far harvest reported, in its namespace
        return pid

    serve_ps_stop(runner(tmp_path), box, tmp_path / "runs" / "lxc", ps_args=("--config", str(box)),
                  pid_here=seen_here)
    assert psutil.pid_exists(init_pid)  # the container itself was never touched
