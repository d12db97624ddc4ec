"""The placement matrix over real OpenSSH (tests/hosts/conftest.py): gpus, preflight, serve --detach +
ps + stop, run, tune (two candidates) and compare of a [host] job on a real engine (llama-server on
the tiny model), on the box itself and inside a container entered through an exec prefix; the
documents in their documented shapes, the servers' pids seen on that box (inside the container:
under the container's own pid namespace), every far stop verified clean there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests import engines, harvest_process
from tests.hosts.test_container import PREFLIGHT, container, server_table  # noqa: F401 - the fixture
from tests.placement.matrix import Place, engine_folders, every_command

pytestmark = [pytest.mark.engine]
HARVEST = str(Path(sys.executable).with_name("harvest"))


def runner(tmp_path: Path):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "near-state")}

    def harvest(*args: str) -> subprocess.CompletedProcess:
        return harvest_process.run([HARVEST, *args], capture_output=True, text=True, timeout=400, env=env)

    return harvest


def test_every_command_on_a_box(tmp_path, sshd, llama_server_bin, tiny_gguf):
    tables = {"server": server_table(llama_server_bin, tiny_gguf, engines.free_port()), "preflight": PREFLIGHT,
              "host": sshd.host_table()}
    label = f"root@127.0.0.1:{sshd.port}"
    every_command(Place("ssh", runner(tmp_path), tables, where=lambda w: w == label), tmp_path)
    assert (tmp_path / "served" / "placement.json").exists()
    assert all(p.is_relative_to(sshd.state_dir) for p in engine_folders(tmp_path / "run"))  # the far harvest's


def in_namespace(ns: str, far_pid: int) -> psutil.Process | None:
    """The process of the container's pid namespace ``ns`` whose pid there is ``far_pid`` (None: none)."""
    for p in psutil.process_iter():
        try:
            if os.readlink(f"/proc/{p.pid}/ns/pid") != ns:
                continue
            status = Path(f"/proc/{p.pid}/status").read_text()
        except OSError:
            continue
        nspids = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspids[-1]) == far_pid and p.status() != psutil.STATUS_ZOMBIE:
            return p
    return None


def test_every_command_in_a_container(tmp_path, sshd, container, llama_server_bin, tiny_gguf):  # noqa: F811
    init_pid, ns = container
    sshd.extra_prefix = ["nsenter", "-t", str(init_pid), "-p", "-m", "--"]
    tables = {"server": server_table(llama_server_bin, tiny_gguf, engines.free_port()), "preflight": PREFLIGHT,
              "host": sshd.host_table()}
    label = f"root@127.0.0.1:{sshd.port}"

    def seen_here(far_pid: int) -> int:
        found = in_namespace(ns, far_pid)  # the engine as this machine sees it, inside the container
        assert found is not None, far_pid
        return found.pid

    def gone_there(far_pid: int, create_time: float) -> bool:  # recorded in the container's namespace
        return in_namespace(ns, far_pid) is None

    every_command(Place("ssh", runner(tmp_path), tables, where=lambda w: w == label, pid_here=seen_here,
                        engine_gone=gone_there), tmp_path)
    assert psutil.pid_exists(init_pid)  # the container itself was never touched
