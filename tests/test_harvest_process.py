"""The tests' forked ``harvest`` commands (tests/harvest_process.py) behave as fresh ones.

- A command's output and exit status are the same forked and fresh: the help (wrapped at the
  caller's ``COLUMNS``: the caller's environment), a usage error, a job's configuration error named
  with its file, line and key, a missing folder, ``init`` writing into its working directory, all
  three ways to name the command (``-m harvest``, ``-m harvest.cli.main``, the ``harvest`` script).
- A forked command is its own process: the caller's working directory, the fork host's child (not
  the test's), its own session when asked; SIGINT ends a forked ``harvest run`` with the same exit
  status and message as a fresh one. (Its ``/proc/PID/environ`` is the host's start environment:
  the kernel keeps the one a process was started with; harvest reads no other harvest process's.)
- ``run(timeout=...)`` kills a command that overruns and raises ``TimeoutExpired``; nothing of it
  is left.
- An exited command keeps its pid (a zombie) until its exit status is read, as a child of the
  test's own would.
- What the fork cannot reproduce runs fresh: interpreter options (``-X dev``) and an environment
  that differs in what acts at interpreter start.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import harvest_process

SCRIPT = str(Path(sys.executable).with_name("harvest"))


def both(argv: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    kw = {"capture_output": True, "text": True, "timeout": 120, "stdin": subprocess.DEVNULL, **kw}
    return harvest_process.run(argv, **kw), subprocess.run(argv, **kw)  # type: ignore[call-overload]


def same(forked: subprocess.CompletedProcess[str], fresh: subprocess.CompletedProcess[str]) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_command_prints_and_exits_as_a_fresh_one(tmp_path):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "97"}
    bad = tmp_path / "job.toml"
    bad.write_text('[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n[data]\npath = "p.jsonl"\n'
                   '[sampling]\nmax_new_tokens = 4\n')
    cases = [
        [sys.executable, "-m", "harvest", "--help"],
        [sys.executable, "-m", "harvest", "export", "--format", "nonsense", str(tmp_path)],
        [sys.executable, "-m", "harvest.cli.main", "run", str(bad), "--no-live"],
        [SCRIPT, "status", str(tmp_path / "missing")],
        [SCRIPT, "version"],
    ]
    for argv in cases:
        forked, fresh = both(argv, env=env)
        same(forked, fresh)
    assert forked.returncode == 0 and forked.stdout.strip()
    forked, fresh = both([sys.executable, "-m", "harvest.cli.main", "run", str(bad), "--no-live"], env=env)
    assert forked.returncode == 2 and "max_new_tokens" in forked.stderr and "max_tokens" in forked.stderr
    # init writes into the working directory each was given
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    forked = harvest_process.run([sys.executable, "-m", "harvest", "init", "--engine", "vllm"], cwd=tmp_path / "a",
                                 env=env, capture_output=True, text=True, timeout=120)
    fresh = subprocess.run([sys.executable, "-m", "harvest", "init", "--engine", "vllm"], cwd=tmp_path / "b", env=env,
                           capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.replace(str(tmp_path / "a"), "D") == fresh.stdout.replace(str(tmp_path / "b"), "D")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert [p.read_text() for p in sorted((tmp_path / "a").iterdir())] == \
        [p.read_text() for p in sorted((tmp_path / "b").iterdir())]


def black_hole_job(tmp_path: Path, hole: socket.socket) -> Path:
    """A run whose endpoint accepts connections and never answers: ``harvest run`` waits."""
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:{hole.getsockname()[1]}/v1"\n'
                   'model = "m"\n[client]\nstart_deadline = 300\n[data]\npath = "p.jsonl"\n'
                   '[sampling]\nmax_tokens = 4\n[output]\ndir = "run"\n')
    return job


def asking(hole: socket.socket, timeout: float = 60) -> socket.socket:
    """The run's first connection to the endpoint: it is past its imports, its ingest and its
    checks, and waiting for an answer that does not come."""
    hole.settimeout(timeout)
    return hole.accept()[0]


def test_a_forked_run_is_its_own_process_and_stops_on_sigint_as_a_fresh_one(tmp_path):
    hole = socket.create_server(("127.0.0.1", 0), backlog=64)
    said = {}
    try:
        for how, start in (("forked", harvest_process.popen), ("fresh", subprocess.Popen)):
            folder = tmp_path / how
            folder.mkdir()
            job = black_hole_job(folder, hole)
            env = {**os.environ, "HARVEST_STATE_DIR": str(folder / "state")}
            proc = start([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], cwd=folder, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                held = asking(hole)
                me = psutil.Process(proc.pid)
                assert me.cwd() == str(folder)
                assert os.getsid(proc.pid) == proc.pid  # start_new_session
                if how == "forked":
                    assert me.ppid() == harvest_process._HOST.proc.pid != os.getpid()
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
            held.close()
            said[how] = (proc.returncode, re.sub(r"\(\d+\.\d s\)", "(T)", err.replace(str(folder), "D")))
    finally:
        hole.close()
    assert said["forked"][0] == 130 and "interrupted: 1 item pending;" in said["forked"][1], said["forked"]
    assert said["forked"] == said["fresh"]


def test_a_timeout_kills_the_forked_command_and_leaves_nothing(tmp_path):
    hole = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        job = black_hole_job(tmp_path, hole)
        with pytest.raises(subprocess.TimeoutExpired) as caught:
            harvest_process.run([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], cwd=tmp_path,
                                env={**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")},
                                capture_output=True, text=True, timeout=3)
    finally:
        hole.close()
    assert "input: 1 row" in (caught.value.stdout or "") + (caught.value.stderr or "")  # it had started
    host = psutil.Process(harvest_process._HOST.proc.pid)
    end = time.monotonic() + 30
    while time.monotonic() < end and host.children():
        time.sleep(0.05)
    assert host.children() == []  # killed and reaped


def test_what_the_fork_cannot_reproduce_runs_fresh(tmp_path):
    argv = [sys.executable, "-X", "dev", "-c", "import sys; print(sys.flags.dev_mode)"]
    assert harvest_process.run(argv, capture_output=True, text=True, timeout=60).stdout == "True\n"
    # PYTHONWARNINGS acts at start: a forked command would keep the host's (none), a fresh one has it
    argv = [sys.executable, "-m", "harvest", "version"]
    env = {**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning"}
    proc = harvest_process.popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert isinstance(proc, subprocess.Popen)
    assert proc.communicate(timeout=60)[0].strip()


def test_an_exited_command_keeps_its_pid_until_its_exit_status_is_read():
    """As a child of the test's own would: ``os.kill(proc.pid, ...)`` before ``poll()`` says it
    ended never reaches another process."""
    proc = harvest_process.popen([sys.executable, "-m", "harvest", "version"], stdout=subprocess.DEVNULL)
    me = psutil.Process(proc.pid)
    end = time.monotonic() + 60
    while time.monotonic() < end and me.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.02)
    assert me.status() == psutil.STATUS_ZOMBIE  # exited, not reaped: its pid is still taken
    time.sleep(0.2)
    assert me.is_running() and me.status() == psutil.STATUS_ZOMBIE
    assert proc.wait(30) == 0
    end = time.monotonic() + 30
    while time.monotonic() < end and me.is_running():
        time.sleep(0.02)
    assert not me.is_running()  # reaped once its exit status was read
