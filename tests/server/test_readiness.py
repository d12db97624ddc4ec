"""Readiness waits: in order, bounded, failing fast on exit and on fatal log lines."""

from __future__ import annotations

import threading
import time

import pytest

from harvest.config import ServerConfig
from harvest.errors import LaunchError
from harvest.server.base import COMMON_FATAL, ReadinessCheck
from harvest.server.readiness import LogWatcher, wait_ready
from tests.engines import free_port


def test_log_watcher_returns_complete_lines_and_keeps_a_tail(tmp_path):
    path = tmp_path / "server.log"
    w = LogWatcher(path, tail_lines=2)
    assert w.read_new() == ""
    path.write_text("one\ntw")
    assert w.read_new() == "one\n"
    with open(path, "a") as fh:
        fh.write("o\nthree\nfour")
    assert w.read_new() == "two\nthree\n"
    assert w.flush() == "four"
    assert w.tail() == "three\nfour"
    assert w.text() == "one\ntwo\nthree\nfour"


def _config() -> ServerConfig:
    # Nothing listens on this port: the check can never pass.
    return ServerConfig(engine="command", command=["x"], port=free_port(), health_url="http://127.0.0.1:{port}/h")


def test_process_exit_fails_fast_with_exit_code_and_tail(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("loading\nfatal: weights missing\n")
    t = time.monotonic()
    with pytest.raises(LaunchError) as info:
        wait_ready(config=_config(), checks=(ReadinessCheck("health", url="http://127.0.0.1:9/h"),),
                   fatal_patterns=COMMON_FATAL, log=LogWatcher(path), poll_exit=lambda: 3, deadline_s=60)
    assert time.monotonic() - t < 5
    err = info.value
    assert err.reason == "exited" and err.returncode == 3 and "weights missing" in err.log_tail


def test_traceback_split_across_reads_reports_the_specific_cause(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("INFO starting\nTraceback (most recent call last):\n")

    def finish() -> None:
        time.sleep(0.3)
        with open(path, "a") as fh:
            fh.write('  File "srv.py", line 1\nOSError: [Errno 98] Address already in use\n')

    threading.Thread(target=finish).start()
    with pytest.raises(LaunchError) as info:
        wait_ready(config=_config(), checks=(ReadinessCheck("port", kind="port"),), fatal_patterns=COMMON_FATAL,
                   log=LogWatcher(path), poll_exit=lambda: None, deadline_s=30)
    assert info.value.reason == "port_in_use"
    assert "Address already in use" in info.value.log_tail


def test_deadline_is_kept(tmp_path):
    t = time.monotonic()
    with pytest.raises(LaunchError) as info:
        wait_ready(config=_config(), checks=(ReadinessCheck("port", kind="port"),), fatal_patterns=COMMON_FATAL,
                   log=LogWatcher(tmp_path / "none.log"), poll_exit=lambda: None, deadline_s=1.0, interval=0.1)
    took = time.monotonic() - t
    # The wait ends at its deadline, not at some later poll (slack for a loaded machine).
    assert info.value.reason == "timeout" and 1.0 <= took < 3.0
    assert "waiting for check 'port'" in str(info.value)


def test_cancel_ends_the_wait(tmp_path):
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    with pytest.raises(LaunchError) as info:
        wait_ready(config=_config(), checks=(ReadinessCheck("port", kind="port"),), fatal_patterns=(),
                   log=None, poll_exit=lambda: None, deadline_s=30, cancelled=flag.is_set, interval=0.1)
    assert info.value.reason == "cancelled"
