"""Every remote step is bounded and fails with one line naming host, step and time waited: a refused
key, a host that never answers (a loopback port that is listened on and never served), a prefix
that ignores signals and never returns, a missing far harvest, a far harvest of another version.
Real OpenSSH throughout (conftest.py); no engine needed."""

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

from tests import harvest_process
from tests.gpu.schema_doc import place_answers
from tests.hosts.conftest import FAR_HARVEST, keygen, write_toml

HANG = r"""
import os, signal, sys, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
open(sys.argv[1], "w").write(f"{os.getpid()}\n")
time.sleep(600)
"""

OTHER_VERSION = r"""#!/bin/sh
echo '{"schema": "harvest.version/1", "version": "0.0.1-other", "schemas": {"stop": "harvest.stop/0"}}'
"""


def gpus(box: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([FAR_HARVEST, "gpus", "--config", str(box)], capture_output=True, text=True,
                               timeout=timeout)


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: host "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def test_wrong_key_is_one_line_exit_2(tmp_path, sshd):
    other = keygen(tmp_path / "not_authorized")
    box = write_toml(tmp_path / "box.toml", {"host": sshd.host_table(identity_file=str(other))})
    res = gpus(box)
    assert res.returncode == 2
    line = one_error_line(res)
    assert f"root@127.0.0.1:{sshd.port}" in line and "handshake (ssh login)" in line and "key was refused" in line


def test_blackholed_port_fails_within_connect_timeout(tmp_path, sshd):
    # A socket that listens and never accepts: the TCP handshake completes in the kernel, the SSH
    # banner never comes. Only connect_timeout can end the wait: command_timeout is 10 minutes.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    try:
        table = sshd.host_table(port=hole.getsockname()[1], connect_timeout=2, command_timeout=600)
        box = write_toml(tmp_path / "box.toml", {"host": table})
        res = gpus(box, timeout=60)  # 60 s: far below command_timeout, far above connect_timeout
    finally:
        hole.close()
    assert res.returncode == 1
    line = one_error_line(res)
    assert "ssh connect" in line and "connect_timeout 2" in line, line
    waited = float(line.split(" failed after ")[1].split(" s:")[0])
    # RELIABILITY.md: it ends within connect_timeout; +10 s is the slack a loaded 2-core machine needs.
    assert 2 <= waited <= 2 + 10, waited


def test_prefix_that_ignores_signals_and_never_returns_is_bounded(tmp_path, sshd):
    script, pidfile = tmp_path / "hang.py", tmp_path / "hang.pid"
    script.write_text(HANG)
    sshd.extra_prefix = [sys.executable, str(script), str(pidfile), "--"]
    box = write_toml(tmp_path / "box.toml", {"host": sshd.host_table(command_timeout=3)})
    try:
        res = gpus(box, timeout=120)
        assert res.returncode == 1
        line = one_error_line(res)
        assert "handshake failed" in line and "no answer within" in line and "ssh client was stopped" in line
    finally:
        _kill_started_by_test(pidfile)


def test_missing_far_harvest_is_configuration(tmp_path, sshd):
    box = write_toml(tmp_path / "box.toml", {"host": sshd.host_table(harvest=str(tmp_path / "no-harvest"))})
    res = gpus(box)
    assert res.returncode == 2
    assert "could not be run" in one_error_line(res)


def test_other_far_version_is_refused_naming_both(tmp_path, sshd):
    other = tmp_path / "other-harvest"
    other.write_text(OTHER_VERSION)
    other.chmod(0o755)
    box = write_toml(tmp_path / "box.toml", {"host": sshd.host_table(harvest=str(other))})
    res = gpus(box)
    assert res.returncode == 2
    from harvest import __version__

    line = one_error_line(res)
    assert "'0.0.1-other'" in line and repr(__version__) in line and "schemas differ" in line


def test_local_prefix_that_never_returns_is_bounded(tmp_path):
    """The same bound without SSH: [host] with only an exec prefix (a container on this machine)."""
    script, pidfile = tmp_path / "hang.py", tmp_path / "hang.pid"
    script.write_text(HANG)
    box = write_toml(tmp_path / "box.toml", {"host": {
        "exec_prefix": [sys.executable, str(script), str(pidfile), "--"], "harvest": FAR_HARVEST,
        "command_timeout": 2}})
    try:
        res = gpus(box)
        assert res.returncode == 1
        assert "exec prefix was stopped" in one_error_line(res)
    finally:
        _kill_started_by_test(pidfile)


def _kill_started_by_test(pidfile: Path) -> None:
    """The hanging prefix this test made run (its pid file says which); gone already if its group was."""
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


def test_config_errors_name_the_host_table(tmp_path):
    from harvest.config import parse_config
    from harvest.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config({"host": {"ssh": "a@b", "ssh_options": ["-v"]}})
    assert "[host] ssh_options" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_config({"host": {"ssh": "a@b"}, "hosts": [{"ssh": "c@d"}]})
    assert "either [host] or [[hosts]]" in str(err.value)
    cfg = parse_config({"hosts": [{"ssh": "a@b", "identity_file": "k"}]}, base=tmp_path)
    assert cfg.far_hosts()[0].identity_file == str(tmp_path / "k")
    assert json.loads(json.dumps(cfg.far_hosts()[0].model_dump(mode="json")))["port"] == 22


def test_preflight_runs_on_the_far_host(tmp_path, sshd):
    """The far harvest measures its own machine: a port held there fails the far preflight (exit 1)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")  # the paths rule finds the model and the binary (never run): only the port fails
    server = {"engine": "llamacpp", "model": str(model), "port": port, "command": [sys.executable]}
    box = write_toml(tmp_path / "box.toml", {"server": server, "preflight": {"min_disk_free_gib": 0.1,
                                                                             "ram_reserve_gib": 0},
                                              "host": sshd.host_table()})
    try:
        res = harvest_process.run([FAR_HARVEST, "preflight", str(box), "--json"], capture_output=True, text=True,
                                  timeout=120)
    finally:
        held.close()
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    (entry,) = place_answers(doc, "harvest.preflight/2")
    assert doc["places"][0]["where"] == f"root@127.0.0.1:{sshd.port}" and entry["passed"] is False
    failed = [r for r in entry["results"] if not r["passed"]]
    assert [r["rule"] for r in failed] == ["port"], failed
    res = harvest_process.run([FAR_HARVEST, "preflight", str(box)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and f"PASS on root@127.0.0.1:{sshd.port}" in res.stdout, res.stdout + res.stderr
