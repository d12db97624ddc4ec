"""Every refusal about a run folder comes before any engine is spawned; one that can only come
after (a file planted between the check and the write) stops the engine with the verified stop.

`harvest run` of a job with a managed llama-server, each time with one file harvest would refuse
to write planted in the run folder: a second name (hard link) of a file elsewhere, a symlink, a
file of another user, or a server folder others can write in. Each is refused (exit 2, the path
and why) with no engine spawned, measured: this test process is a child subreaper while harvest
runs, so an engine harvest spawned and left behind would be reparented to it and seen among its
children; the job's port is free, and the planted file's target keeps its bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harvest.campaign.outputs.progress import PROGRESS_FILE
from harvest.campaign.outputs.timeline import TIMELINE_FILE
from harvest.config import ServerConfig
from harvest.errors import UnsafePathError
from harvest.ledger.schema import LEDGER_FILE, LOCK_FILE
from harvest.net import port_listening
from harvest.report import REPORT_FILE
from harvest.server import Server, supervisor
from harvest.server.state import RUN_FILES
from tests import engines, harvest_process
from tests.realparts import require
from tests.server.helpers import TEST_PREFLIGHT

pytestmark = [pytest.mark.engine]

#: Every file harvest writes in a run folder and refuses when it is not its own, by path in it.
PLANTED = [LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm", LOCK_FILE, PROGRESS_FILE, TIMELINE_FILE,
           REPORT_FILE, *(f"server/{name}" for name in RUN_FILES)]
VICTIM = b"a file of the user's own, elsewhere: 57 bytes it keeps\n"
PR_SET_CHILD_SUBREAPER = 36
NOBODY = 65534


def test_the_list_names_every_file_a_launch_writes():
    """A file added to the server's list of run files is planted below too."""
    assert {f"server/{name}" for name in RUN_FILES} <= set(PLANTED)
    assert {"server/launch.json", "progress.json"} <= set(PLANTED)


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process as a child subreaper for the block: a descendant orphaned meanwhile (an engine
    whose harvest exited) becomes its child instead of init's."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def children() -> set[tuple[int, float]]:
    """This process's descendants but the fork host of its harvest commands (tests/harvest_process.py:
    a command's own children are listed; once it exits its orphans are this process's)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid != harvest_process.host_pid():
                out.add((p.pid, p.create_time()))
    return out


def stop_left(found: set[tuple[int, float]]) -> list[str]:
    """Names of the processes left behind (each ended here, by its pid and create time, then reaped)."""
    names = []
    for pid, created in found:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if abs(p.create_time() - created) > 0.05:
                continue
            names.append(f"{pid} {p.name()} {' '.join(p.cmdline()[:3])}")
            p.send_signal(signal.SIGKILL)
            p.wait(10)
    return names


def port_free(port: int) -> bool:
    if port_listening("127.0.0.1", port, timeout=0.5):
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def job(tmp_path: Path, llama_server_bin: str, tiny_gguf: Path, port: int) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Say {i}."}) + "\n" for i in range(6)))
    path = tmp_path / "job.toml"
    path.write_text(
        f'[data]\npath = "{data}"\n[sampling]\nmax_tokens = 4\n[output]\ndir = "{tmp_path / "run"}"\n'
        f'[server]\nengine = "llamacpp"\nmodel = "{tiny_gguf}"\ncommand = ["{llama_server_bin}"]\nport = {port}\n'
        f'max_running_requests = 2\nextra_args = ["-c", "2048"]\nready_timeout = 60\nstop_grace = 2\n'
        f'stop_deadline = 15\n[preflight]\nmin_disk_free_gib = 0.05\nram_reserve_gib = 0\n')
    return path


def refused_run(tmp_path: Path, job_file: Path, port: int) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`harvest run` as a user runs it, under the subreaper; returns it and what it left running."""
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    before = children()
    with subreaper():
        done = harvest_process.run([sys.executable, "-m", "harvest", "run", str(job_file), "--no-live"], env=env,
                                   capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        left = stop_left(children() - before)
    assert port_free(port), f"port {port} is taken after the refusal"
    return done, left


def run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "server").mkdir(mode=0o700, parents=True)
    run.chmod(0o700)
    return run


@pytest.mark.parametrize("name", PLANTED)
def test_a_hard_linked_file_in_the_run_folder_is_refused_before_any_engine_is_spawned(
        tmp_path, llama_server_bin, tiny_gguf, name):
    port = engines.free_port()
    job_file = job(tmp_path, llama_server_bin, tiny_gguf, port)
    run = run_folder(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    os.link(victim, run / name)

    done, left = refused_run(tmp_path, job_file, port)

    shown = done.stdout + done.stderr
    assert left == [], f"harvest left processes running: {left}\n{shown}"
    assert done.returncode == 2 and "Traceback" not in shown, shown
    assert f"{run / name}: has 2 hard links" in done.stderr, shown
    assert victim.read_bytes() == VICTIM
    assert name == "server/server.log" or not (run / "server" / "server.log").exists()  # the engine never ran


@pytest.mark.parametrize("name", ["server/launch.json", PROGRESS_FILE])
@pytest.mark.parametrize("kind", ["symlink", "another user's", "a folder others can write in"])
def test_links_owners_and_modes_are_refused_before_any_engine_is_spawned(tmp_path, llama_server_bin, tiny_gguf,
                                                                         name, kind):
    port = engines.free_port()
    job_file = job(tmp_path, llama_server_bin, tiny_gguf, port)
    run = run_folder(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    target = run / name
    if kind == "symlink":
        target.symlink_to(victim)
        why = f"{target}: is a symlink (to {victim})"
    elif kind == "another user's":
        require("root", "a file of another user is made with chown")
        target.write_bytes(VICTIM)
        os.chown(target, NOBODY, NOBODY)
        why = f"{target}: is owned by"
    else:
        target.parent.chmod(0o777)
        why = f"{target.parent}: is writable by group and others"

    done, left = refused_run(tmp_path, job_file, port)

    shown = done.stdout + done.stderr
    assert left == [], f"harvest left processes running: {left}\n{shown}"
    assert done.returncode == 2 and "Traceback" not in shown, shown
    assert why in done.stderr, shown
    assert victim.read_bytes() == VICTIM
    assert not (run / "server" / "server.log").exists()  # the engine never ran


def test_a_linked_logprob_folder_is_refused_before_any_engine_is_spawned(tmp_path, llama_server_bin, tiny_gguf):
    """``logprobs`` as a link to another folder holding a shard no row of this run references: the
    trim at open would remove it through the link; it is refused instead, nothing spawned."""
    port = engines.free_port()
    job_file = job(tmp_path, llama_server_bin, tiny_gguf, port)
    run = run_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "shard-000000.bin").write_bytes(VICTIM)
    (run / "logprobs").symlink_to(elsewhere)

    done, left = refused_run(tmp_path, job_file, port)

    shown = done.stdout + done.stderr
    assert left == [], f"harvest left processes running: {left}\n{shown}"
    assert done.returncode == 2 and "Traceback" not in shown, shown
    assert f"{run / 'logprobs'}: the logprob folder is not a folder (a link or a file)" in done.stderr, shown
    assert (elsewhere / "shard-000000.bin").read_bytes() == VICTIM
    assert not (run / "server" / "server.log").exists()  # the engine never ran


def test_a_record_refused_after_the_spawn_stops_the_engine_first(tmp_path, llama_server_bin, tiny_gguf,
                                                                 monkeypatch):
    """``launch.json`` planted as a hard link after the launch checked the folder (here: right after
    the last launch's files were moved aside, the last check before the spawn), so the record's write
    right after the spawn is refused: the engine is stopped, verified, before the refusal reaches the
    caller, and nothing of it is left."""
    folder = tmp_path / "served"
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    keep = supervisor.keep_last_launch

    def keep_then_plant(held: object) -> int:
        number = keep(held)
        os.link(victim, folder / "launch.json")
        return number

    monkeypatch.setattr(supervisor, "keep_last_launch", keep_then_plant)
    cfg = ServerConfig(engine="llamacpp", model=str(tiny_gguf), command=[llama_server_bin],
                       port=engines.free_port(), extra_args=["-c", "2048"], ready_timeout=60, stop_grace=2,
                       stop_deadline=15)
    server = Server(cfg, run_dir=folder, preflight=TEST_PREFLIGHT)
    with pytest.raises(UnsafePathError, match="launch.json: has 2 hard links"):
        server.launch()

    pid = server.pid
    assert pid is not None, "the refusal came before the spawn: this test plants too late"
    report = server.stop_report
    assert report is not None and report.clean, report
    assert report.pid == pid
    assert not psutil.pid_exists(pid)  # stopped and reaped
    assert port_free(cfg.port)
    assert victim.read_bytes() == VICTIM
