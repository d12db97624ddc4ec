"""A far launch that outlives the near side's budget is found again and stopped there.

The near side names the far run folder (``serve --run-name``) and writes its record before the far
launch; when the far ``serve`` gives no answer in time, it looks the folder up by that name (far
``ps --json``) and stops what is there (far ``stop --json``). The far serve in the SSH test finishes
its launch (the server is ready and detached) but its answer never comes back: the exec prefix
keeps the session open afterwards, like a ``pct exec`` that hangs on exit. Without the recovery the
far server would stay up with nobody holding a record of it.

The far ``serve --give-up-after`` bound (no SSH needed): a server whose readiness never comes is
given up and stopped by the far harvest itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from harvest.placement.ssh.servers import read_remote_record
from tests import engines
from tests import harvest_process
from tests.hosts.conftest import FAR_HARVEST, write_toml

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"

#: An exec prefix that runs the far command, then, after a `serve`, keeps the session open (its
#: stdout held, signals ignored) instead of returning: the answer never reaches the near side.
HANG_AFTER_SERVE = r"""
import os, signal, subprocess, sys, time
pidfile, cmd = sys.argv[1], sys.argv[3:]
rc = subprocess.call(cmd)
if "serve" in cmd:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)
    open(pidfile, "w").write(f"{os.getpid()}\n")
    time.sleep(600)
sys.exit(rc)
"""


def chat_server(port: int, **over: object) -> dict[str, object]:
    table: dict[str, object] = {
        "engine": "command", "port": port,
        "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"],
        "health_url": "http://{host}:{port}/health", "ready_timeout": 20, "stop_grace": 2, "stop_deadline": 10}
    table.update(over)
    return table


def alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_far_serve_cut_off_by_the_near_budget_is_found_and_stopped(tmp_path, sshd):
    script, pidfile = tmp_path / "hang_after_serve.py", tmp_path / "hang.pid"
    script.write_text(HANG_AFTER_SERVE)
    sshd.extra_prefix = [sys.executable, str(script), str(pidfile), "--"]
    host = sshd.host_table(connect_timeout=5, command_timeout=8)
    box = write_toml(tmp_path / "box.toml", {"server": chat_server(engines.free_port()),
                                              "preflight": {"min_disk_free_gib": 0.05}, "host": host})
    near = tmp_path / "near"
    try:
        t0 = time.monotonic()
        res = harvest_process.run([FAR_HARVEST, "serve", str(box), "--detach", "--run-dir", str(near)],
                                  capture_output=True, text=True, timeout=240)
        took = time.monotonic() - t0
        assert pidfile.exists(), "the far serve never got as far as its answer: " + res.stderr
    finally:
        _end_hanging_prefix(pidfile)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("launch failed:")]
    # One line naming host, step and the time waited (the budget: connect + command + ready timeouts).
    assert f"host root@127.0.0.1:{sshd.port}: serve failed after " in line, line
    waited = float(line.split("serve failed after ")[1].split(" s:")[0])
    assert 5 + 8 + 20 - 1 <= waited < took, (waited, took)
    assert "stopped it: clean" in line, line

    # The near record, written before the launch, named the far folder; it now says stopped.
    record = read_remote_record(near)
    assert record is not None and record["status"] == "stopped", record
    far_dir = Path(record["far_run_dir"])
    assert far_dir == sshd.state_dir / "servers" / record["far_run_name"]
    # Measured on the far side: the launch had become ready (it was running when the near side gave
    # up), and its recorded engine is gone now; the far stop report is clean.
    launch = json.loads((far_dir / "launch.json").read_text())
    assert launch["record"]["pid"] and not alive(launch["record"]["pid"], launch["record"]["create_time"])
    assert json.loads((far_dir / "stop.json").read_text())["verdict"] == "clean"
    listed = harvest_process.run([FAR_HARVEST, "ps", "--json", "--config", str(box)], capture_output=True, text=True,
                                 timeout=120)
    assert listed.returncode == 0 and json.loads(listed.stdout)["servers"] == [], listed.stdout + listed.stderr


def test_far_serve_gives_up_when_readiness_never_comes(tmp_path, monkeypatch):
    """``serve --give-up-after``: the far side bounds its own launch and stops what it started."""
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    port = engines.free_port()
    never = chat_server(port, command=[sys.executable, "-c", "import time; time.sleep(300)"],
                        ready_timeout=300)
    box = write_toml(tmp_path / "box.toml", {"server": never, "preflight": {"min_disk_free_gib": 0.05}})
    t0 = time.monotonic()
    res = harvest_process.run([FAR_HARVEST, "serve", str(box), "--detach", "--json", "--run-name", "cut-1",
                          "--give-up-after", "3"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout == ""  # no serve document: nothing was left running
    assert "not ready within --give-up-after 3 s; gave up" in res.stderr, res.stderr
    assert took < 60
    run_dir = tmp_path / "state" / "servers" / "cut-1"
    launch = json.loads((run_dir / "launch.json").read_text())
    assert not alive(launch["record"]["pid"], launch["record"]["create_time"])
    assert json.loads((run_dir / "stop.json").read_text())["verdict"] == "clean"

    # The same name again is refused (the folder holds a launch), and so is a path for a name.
    again = harvest_process.run([FAR_HARVEST, "serve", str(box), "--detach", "--run-name", "cut-1"],
                                capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a launch" in again.stderr, again.stderr
    bad = harvest_process.run([FAR_HARVEST, "serve", str(box), "--detach", "--run-name", "../x"],
                              capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--run-name" in bad.stderr, bad.stderr


def _end_hanging_prefix(pidfile: Path) -> None:
    """The hanging prefix this test made run (its pid file says which), by that pid."""
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    try:
        proc = psutil.Process(pid)
        if str(pidfile) in proc.cmdline():
            os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=10)
    except (psutil.NoSuchProcess, ProcessLookupError):
        pass


def test_stop_by_a_record_written_before_the_answer(tmp_path, sshd):
    """A near record whose launch never answered (no far run folder in it, status unknown):
    `harvest stop NEAR` finds the far folder by its name and stops it there; an unknown name is
    nothing to stop (exit 2, one line)."""
    box = write_toml(tmp_path / "box.toml", {"server": chat_server(engines.free_port()),
                                              "preflight": {"min_disk_free_gib": 0.05},
                                              "host": sshd.host_table()})
    near = tmp_path / "near"
    res = harvest_process.run([FAR_HARVEST, "serve", str(box), "--detach", "--run-dir", str(near)],
                              capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    record = read_remote_record(near)
    far_dir = Path(record["far_run_dir"])
    assert far_dir.name == record["far_run_name"]
    # What the near record holds when the far answer never came: the name only.
    for key in ("far_run_dir", "far_url", "far_port", "far_pid", "tunnel"):
        record.pop(key, None)
    record["status"] = "unknown"
    (near / "placement.json").write_text(json.dumps(record))
    res = harvest_process.run([FAR_HARVEST, "stop", str(near), "--json"], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["verdict"] == "clean" and [s["run_dir"] for s in report["servers"]] == [str(far_dir)]
    launch = json.loads((far_dir / "launch.json").read_text())["record"]
    assert not alive(launch["pid"], launch["create_time"])

    record["far_run_name"] = "never-launched"
    (near / "placement.json").write_text(json.dumps(record))
    res = harvest_process.run([FAR_HARVEST, "stop", str(near)], capture_output=True, text=True, timeout=240)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert f"host root@127.0.0.1:{sshd.port}: stop failed" in line and "'never-launched'" in line, line
