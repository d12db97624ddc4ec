"""Every launch in a run folder kept (server/history.py): a relaunch into the same folder moves the
last launch's log, record and stop report to ``launches/N/`` instead of truncating them; the
number of launches and the size of a kept log are bounded; a frozen (SIGSTOPped) engine acts on its
stop's SIGTERM at once (SIGCONT after it) instead of waiting for SIGKILL."""

from __future__ import annotations

import json
import os
import signal

from harvest import safefiles
from harvest.server import Server
from harvest.server.history import KEPT_LAUNCHES, keep_last_launch, kept_numbers, log_of
from tests.engines import free_port
from tests.server.helpers import TEST_PREFLIGHT, fake_config, gone


def _launch(run_dir, pids, port):
    return Server(fake_config(pids, port=port), run_dir=run_dir, preflight=TEST_PREFLIGHT).launch()


def test_a_second_launch_keeps_the_first_ones_log_record_and_stop(tmp_path):
    run_dir, pids = tmp_path / "run", tmp_path / "pids"
    first = _launch(run_dir, pids, free_port())
    first_pid = first.state().record.pid
    with open(run_dir / "server.log", "a") as fh:  # what the first engine said before it failed
        fh.write("FIRST ENGINE: core dumped\n")
    assert first.shutdown().clean
    second = _launch(run_dir, pids, free_port())
    try:
        record = second.state().record
        assert record.launch == 2 and record.pid != first_pid
        kept = run_dir / "launches" / "1"
        assert "FIRST ENGINE: core dumped" in (kept / "server.log").read_text()
        assert json.loads((kept / "launch.json").read_text())["record"]["pid"] == first_pid
        assert json.loads((kept / "stop.json").read_text())["verdict"] == "clean"
        assert "FIRST ENGINE" not in (run_dir / "server.log").read_text()  # the new launch's own log
        assert not (run_dir / "stop.json").exists()
        assert log_of(run_dir, 1) == kept / "server.log" and log_of(run_dir, 2) == run_dir / "server.log"
        assert oct(os.stat(kept).st_mode & 0o777) == "0o700"
    finally:
        second.shutdown()


def test_a_frozen_engine_is_continued_after_sigterm_and_stops_without_sigkill(tmp_path):
    pids = tmp_path / "pids"
    server = _launch(tmp_path / "run", pids, free_port())
    leader = server.state().record.leader
    os.killpg(server.state().record.pgid, signal.SIGSTOP)  # the group harvest launched, frozen whole
    report = server.shutdown()
    assert report is not None and report.clean and not report.escalated, report
    assert "SIGCONT to" in (report.step("sigterm").outcome if report.step("sigterm") else ""), report.steps
    assert gone(leader.pid, leader.create_time)


def _plant(folder: safefiles.Folder, number: int, log: bytes = b"log\n") -> None:
    folder.write_atomic("server.log", log)
    folder.write_atomic("launch.json", json.dumps({"record": {"launch": number}}))


def test_the_first_and_the_latest_launches_are_kept_and_a_long_log_keeps_its_head_and_tail(tmp_path, monkeypatch):
    monkeypatch.setattr("harvest.server.history.KEPT_LOG_BYTES", 4096)
    monkeypatch.setattr("harvest.server.history.HEAD_BYTES", 1024)
    with safefiles.hold(tmp_path / "run", create=True) as folder:
        for n in range(1, KEPT_LAUNCHES + 6):
            _plant(folder, n, b"H" * 1024 + b"M" * 10000 + b"T" * 100 if n == 2 else f"launch {n}\n".encode())
            assert keep_last_launch(folder) == n + 1
        numbers = kept_numbers(folder)
    assert len(numbers) == KEPT_LAUNCHES and numbers[0] == 1 and numbers[-1] == KEPT_LAUNCHES + 5
    assert (tmp_path / "run" / "launches" / "1" / "server.log").read_text() == "launch 1\n"
    assert not (tmp_path / "run" / "launches" / "2").exists()  # dropped: neither the first nor the latest
    with safefiles.hold(tmp_path / "cut", create=True) as folder:
        _plant(folder, 1, b"H" * 1024 + b"M" * 10000 + b"T" * 100)
        keep_last_launch(folder)
    cut = (tmp_path / "cut" / "launches" / "1" / "server.log").read_bytes()
    assert cut.startswith(b"H" * 1024) and cut.endswith(b"T" * 100) and b"bytes of this log cut here" in cut
    assert len(cut) < 4096 + 200
