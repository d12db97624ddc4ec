"""``harvest serve``, ``harvest stop`` and ``harvest ps`` as separate processes, like a user runs them.

The engine is tests/server/fake_engine.py as a `command` engine. Outcomes are measured: exit codes,
the JSON stop report, processes gone (psutil, with create time), the port closed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.net import port_listening
from harvest.server import RunStatus, StateFile
from tests import harvest_process
from tests.engines import free_port
from tests.server.helpers import FAKE_ENGINE, gone, read_pid, wait_for

HARVEST = [sys.executable, "-m", "harvest.cli.main"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


def write_config(path: Path, pid_dir: Path, port: int, *flags: str, grace: float = 5.0) -> Path:
    pid_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(FAKE_ENGINE), "--host", "{host}", "--port", "{port}", "--pid-dir", str(pid_dir),
               *flags]
    path.write_text(
        "[server]\n"
        'engine = "command"\n'
        f"command = {json.dumps(command)}\n"
        'health_url = "http://{host}:{port}/health"\n'
        f"port = {port}\n"
        "ready_timeout = 30\n"
        f"stop_grace = {grace}\n"
        "stop_deadline = 20\n"
        "[preflight]\n"
        "min_disk_free_gib = 0.05\n"
    )
    return path


def harvest(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([*HARVEST, *args], env=env, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)


class Serve:
    """A ``harvest serve`` process this test started (in its own session, so it can be killed alone)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *flags: str, extra: tuple[str, ...] = (),
                 grace: float = 5.0):
        last = ""
        for _ in range(4):  # a port taken between choosing and binding: choose again
            self.port = free_port()
            self.run_dir = tmp_path / f"run-{self.port}"
            self.pid_dir = tmp_path / f"pids-{self.port}"
            cfg = write_config(tmp_path / f"server-{self.port}.toml", self.pid_dir, self.port, *flags, grace=grace)
            self.proc = harvest_process.popen([*HARVEST, "serve", str(cfg), "--run-dir", str(self.run_dir), *extra],
                                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
            self.state = StateFile(self.run_dir)

            def ready_or_exited() -> bool:
                if self.proc.poll() is not None:
                    return True
                try:
                    return self.state.read().status is RunStatus.READY
                except Exception:
                    return False

            wait_for(ready_or_exited, 60, "harvest serve to be ready", interval=0.1)
            if self.state.exists() and self.state.read().status is RunStatus.READY:
                return
            out, err = self.proc.communicate(timeout=30)
            last = f"exit {self.proc.returncode}\n{out}\n{err}"
            if self.state.exists():  # it launched and failed: a real failure, not a taken port
                raise AssertionError(f"harvest serve failed: {last}")
        raise AssertionError(f"harvest serve refused every port: {last}")

    def kill_serve(self) -> None:
        """SIGKILL the ``harvest serve`` process (this test's own child, by pid)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def cleanup(self, env: dict[str, str]) -> None:
        if self.proc.poll() is None:
            self.kill_serve()
        if self.state.exists() and self.state.read().status not in (RunStatus.STOPPED, RunStatus.DIRTY):
            harvest(env, "stop", str(self.run_dir), "--deadline", "15")


@pytest.fixture
def serves(env: dict[str, str]):
    started: list[Serve] = []
    yield started
    for s in started:
        s.cleanup(env)


def test_stop_from_another_process_after_serve_was_sigkilled_is_clean(tmp_path, env, serves):
    s = Serve(tmp_path, env, "--child-ignores-term", "--double-fork", "--intermediate-life", "3")
    serves.append(s)
    w2 = read_pid(s.pid_dir, "w2")
    wait_for(lambda: (s.pid_dir / "w2.setsid").exists(), 20, "w2 to leave the group")
    wait_for(lambda: any(d.pid == w2 for d in s.state.read().descendants), 10, "w2 to be recorded")
    rec = s.state.read().record
    child = read_pid(s.pid_dir, "child")
    watched = {pid: psutil.Process(pid).create_time() for pid in (rec.pid, child, w2)}

    s.kill_serve()
    assert not gone(rec.pid, rec.create_time)  # the engine outlives its launcher
    out = harvest(env, "stop", str(s.run_dir), "--json", "--deadline", "10", "--grace", "1")

    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["schema"] == "harvest.stop/1"
    assert report["verdict"] == "clean" and [r["escalated"] for r in report["servers"]] == [True]
    assert [(r["engine"], r["pid"]) for r in report["servers"]] == [("command", rec.pid)]
    assert all(gone(pid, ct) for pid, ct in watched.items())
    assert not port_listening("127.0.0.1", s.port)


def test_foreground_serve_stops_verified_on_sigterm(tmp_path, env, serves):
    s = Serve(tmp_path, env)
    serves.append(s)
    rec = s.state.read().record

    os.kill(s.proc.pid, signal.SIGTERM)  # as a user's Ctrl-C / service manager would
    out, err = s.proc.communicate(timeout=60)

    assert s.proc.returncode == 0, out + err
    assert "verdict: CLEAN" in out
    assert gone(rec.pid, rec.create_time)
    assert not port_listening("127.0.0.1", s.port)
    assert s.state.read().status is RunStatus.STOPPED


def test_detach_then_ps_then_stop_without_run_dir(tmp_path, env, serves):
    s = Serve(tmp_path, env, extra=("--detach",))
    serves.append(s)
    assert s.proc.wait(30) == 0
    rec = s.state.read().record
    assert not gone(rec.pid, rec.create_time)
    assert s.state.read().watcher is not None

    listed = json.loads(harvest(env, "ps", "--json").stdout)
    assert listed["schema"] == "harvest.ps/1"
    [row] = listed["servers"]
    assert row["pid"] == rec.pid and row["port"] == s.port and row["recorded"]["status"] == "ready"
    assert row["measured"]["leader_alive"] is True and row["measured"]["port_listening"] is True
    assert str(s.port) in harvest(env, "ps").stdout

    out = harvest(env, "stop")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verdict: CLEAN" in out.stdout and f"for command pid {rec.pid} in {s.run_dir}" in out.stdout
    assert gone(rec.pid, rec.create_time)
    again = harvest(env, "stop", str(s.run_dir))  # stopped already: clean again, exit 0
    assert again.returncode == 0 and "verdict: CLEAN" in again.stdout, again.stdout + again.stderr
    assert json.loads(harvest(env, "ps", "--json").stdout)["servers"] == []
    [row] = json.loads(harvest(env, "ps", "--json", "--all").stdout)["servers"]
    assert row["recorded"]["status"] == "stopped" and row["measured"]["alive"] == 0
    assert row["measured"]["port_listening"] is False
    watcher = s.state.read().watcher
    wait_for(lambda: gone(watcher.pid, watcher.create_time), 10, "the watcher to exit by itself")


def test_stop_is_dirty_when_an_unrecorded_worker_escapes_with_the_port(tmp_path, env, serves):
    s = Serve(tmp_path, env, "--escape-with-port")
    serves.append(s)
    escaped = read_pid(s.pid_dir, "escaped")
    escaped_ct = psutil.Process(escaped).create_time()
    s.kill_serve()
    try:
        out = harvest(env, "stop", str(s.run_dir), "--json", "--deadline", "2")
        assert out.returncode == 1, out.stdout + out.stderr
        doc = json.loads(out.stdout)
        (report,) = doc["servers"]
        assert doc["verdict"] == "dirty" and report["verdict"] == "dirty" and report["port_open"] is True
        assert any("port" in p for p in report["problems"])
        assert not gone(escaped, escaped_ct)  # it was never recorded, so it was never signalled
    finally:
        p = psutil.Process(escaped)  # the test's own stray, by pid and create time
        if abs(p.create_time() - escaped_ct) < 0.05:
            p.kill()


def test_serve_refuses_a_taken_port_before_launch(tmp_path, env):
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        cfg = write_config(tmp_path / "server.toml", tmp_path / "pids", port)
        out = harvest(env, "serve", str(cfg), "--run-dir", str(tmp_path / "run"))
        assert out.returncode == 1
        both = out.stdout + out.stderr  # the rule once over both streams, not once on each
        assert both.count(f"port {port} on 127.0.0.1 is in use") == 1, both
        assert both.count(f"refused to launch: port {port} is taken") == 1, both
        assert out.stderr.rstrip().endswith(f"refused to launch: port {port} is taken; stop what holds it, "
                                            f"or set another [server] port"), out.stderr
        assert "--force" not in both, both  # launching anyway does not get the port: never advised
        assert not (tmp_path / "run" / "launch.json").exists()
        assert not (tmp_path / "pids" / "server.pid").exists()
        # harvest run: the rules as the launch checked them, each once, then the same last line.
        data = tmp_path / "in.jsonl"
        data.write_text('{"id": "a", "prompt": "hi"}\n')
        job = tmp_path / "job.toml"
        job.write_text(cfg.read_text() + f'[data]\npath = "{data}"\n[output]\ndir = "{tmp_path / "runs"}"\n')
        out = harvest(env, "run", str(job), "--no-live")
        assert out.returncode == 1, out.stdout + out.stderr
        both = out.stdout + out.stderr
        assert both.count(f"port {port} on 127.0.0.1 is in use") == 1, both
        assert both.count(f"refused to launch: port {port} is taken") == 1, both
        assert "--force" not in both, both
        assert f"refused to launch: port {port} is taken" in out.stderr
        assert not (tmp_path / "pids" / "server.pid").exists()
    finally:
        holder.close()


def test_each_stopped_server_is_named_by_its_engine_pid_and_folder(tmp_path, env, serves):
    """Two servers stopped from another shell: `harvest stop DIR` ends with the verdict for "command
    pid N in DIR"; their two stop reports printed together (as a fleet on several hosts prints
    them) head each server's lines with that name, and one closing line counts them."""
    import dataclasses
    import io
    import re

    from rich.console import Console

    from harvest.cli.render import print_stop_reports
    from harvest.placement.far_records import stop_report_from_dict

    a, b = Serve(tmp_path, env), Serve(tmp_path, env)
    serves += [a, b]
    pid_a, pid_b = a.state.read().record.pid, b.state.read().record.pid
    out = harvest(env, "stop", str(a.run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"^verdict: CLEAN in \d+\.\d\d s \(deadline \d+ s\) for command pid {pid_a} in "
                     rf"{re.escape(str(a.run_dir))}$", out.stdout, re.M), out.stdout
    out = harvest(env, "stop", str(b.run_dir), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    (doc_b,) = json.loads(out.stdout)["servers"]
    reports = [stop_report_from_dict(json.loads((a.run_dir / "stop.json").read_text())),
               stop_report_from_dict(doc_b)]
    assert [(r.engine, r.pid, r.run_dir) for r in reports] == [("command", pid_a, str(a.run_dir)),
                                                                ("command", pid_b, str(b.run_dir))]

    def printed(shown: list) -> list[str]:
        console = Console(file=io.StringIO(), width=400, soft_wrap=True, highlight=False)
        print_stop_reports(shown, "gpu-a, gpu-b", console=console)
        return console.file.getvalue().splitlines()  # type: ignore[attr-defined]

    lines = printed(reports)
    assert [line for line in lines if line.startswith("stop of ")] == [
        f"stop of command pid {pid_a} in {a.run_dir}:", f"stop of command pid {pid_b} in {b.run_dir}:"], lines
    assert len([line for line in lines if line.startswith("verdict: CLEAN in ")]) == 2, lines
    assert lines[-1] == "2 servers on gpu-a, gpu-b: all CLEAN", lines
    dirty = dataclasses.replace(reports[1], verdict="dirty", problems=("port still in use",))
    lines = printed([reports[0], dirty])
    at = lines.index(f"stop of command pid {pid_b} in {b.run_dir}:")  # the dirty one's lines follow its name
    assert "  problem: port still in use" in lines[at:] and lines[-2].startswith("verdict: DIRTY in "), lines
    assert lines[-1] == "2 servers on gpu-a, gpu-b: NOT all clean", lines


def test_stop_with_nothing_to_stop_says_so_and_exits_0(tmp_path, env):
    """A cleanup script may stop twice: a folder without a record, or nothing running, is not an
    error. A folder that does not exist still is (a typo), and --json gives the empty document."""
    (tmp_path / "empty").mkdir()
    out = harvest(env, "stop", str(tmp_path / "empty"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("nothing to stop: no launch record in " + str(tmp_path / "empty")), out.stdout
    out = harvest(env, "stop")
    assert out.returncode == 0 and out.stdout.strip() == "nothing to stop: no server harvest started is running"
    out = harvest(env, "stop", "--json", str(tmp_path / "empty"))
    assert out.returncode == 0 and json.loads(out.stdout) == {"schema": "harvest.stop/1", "verdict": "clean",
                                                             "servers": []}
    assert "nothing to stop" in out.stderr
    out = harvest(env, "stop", str(tmp_path / "typo"))
    assert out.returncode == 2 and out.stderr.strip() == f"error: {tmp_path / 'typo'}: no such folder"


def test_serve_start_up_crash_exits_1_with_the_log_tail(tmp_path, env):
    cfg = write_config(tmp_path / "server.toml", tmp_path / "pids", free_port(), "--crash")
    t = time.monotonic()
    out = harvest(env, "serve", str(cfg), "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 1
    assert "launch failed" in out.stderr and "cannot load weights" in out.stderr
    assert "verdict: CLEAN" in out.stderr
    assert gone(read_pid(tmp_path / "pids", "crash-child", timeout=1))
    assert time.monotonic() - t < 60


def test_foreground_serve_ends_cleanly_when_stopped_from_another_shell(tmp_path, env, serves):
    s = Serve(tmp_path, env)
    serves.append(s)
    rec = s.state.read().record

    out = harvest(env, "stop", str(s.run_dir))
    served_out, served_err = s.proc.communicate(timeout=60)

    assert out.returncode == 0, out.stdout + out.stderr
    assert s.proc.returncode == 0, served_out + served_err
    assert "stopped by `harvest stop` from another process" in served_err
    assert gone(rec.pid, rec.create_time)
