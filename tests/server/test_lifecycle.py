"""Supervised launch and verified stop of `command` engines that misbehave like real ones.

Each test asserts what it measures afterwards: processes gone (psutil, with create time), the port
closed, the StopReport's verdict and steps, and a bystander process still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest import http
from harvest.aiohttp_transport import AiohttpTransport
from harvest.config import ServerConfig
from harvest.errors import LaunchError, PreflightFailed
from harvest.net import port_listening
from harvest.server import ProcessRef, RunStatus, Server, StateFile, stop_run
from tests.engines import free_port
from tests.server.helpers import TEST_PREFLIGHT, fake_config, gone, read_pid, wait_for
from tests.timing import SLACK_S


def test_launch_ready_stop_clean(launcher, tmp_path):
    pids = tmp_path / "pids"
    server = launcher.launch(lambda port: fake_config(pids, port=port))
    state = server.state()
    assert state.status is RunStatus.READY
    assert http.get(server.url + "/health", timeout=5).status == 200
    leader = state.record.leader

    report = server.shutdown()

    assert report is not None and report.verdict == "clean", report
    assert not report.escalated
    assert [s.name for s in report.steps] == ["record", "sigterm", "grace", "gpu", "port"]
    assert gone(leader.pid, leader.create_time)
    assert not port_listening("127.0.0.1", state.record.port)
    assert server.state().status is RunStatus.STOPPED
    assert json.loads((server.run_dir / "stop.json").read_text())["verdict"] == "clean"
    assert server.shutdown() is report  # idempotent


def test_state_file_and_run_dir_are_private_and_argv_redacted(launcher, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_KEY", "s3cret-value-123")
    pids = tmp_path / "pids"
    # The key reaches the engine's argv (as an engine adapter would put it) but not the record.
    server = launcher.launch(lambda port: fake_config(pids, "--ready-after", "0", port=port,
                                                      api_key_env="FAKE_ENGINE_KEY",
                                                      extra_args=["--key-echo", "s3cret-value-123"]))
    sf = StateFile(server.run_dir)
    assert stat.S_IMODE(os.stat(server.run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sf.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sf.log_path).st_mode) == 0o600
    rec = sf.read().record
    assert "***" in rec.argv and "s3cret-value-123" in psutil.Process(server.pid).cmdline()
    assert rec.pid == server.pid and rec.pgid == server.pid  # its own session and group
    assert abs(rec.create_time - psutil.Process(server.pid).create_time()) < 0.05
    assert rec.engine == "command" and rec.port == server.config.port and rec.gpus == ()
    assert "s3cret-value-123" not in sf.path.read_text()


def test_sigterm_trapped_escalates_to_sigkill_inside_deadline(launcher, tmp_path):
    pids = tmp_path / "pids"
    server = launcher.launch(lambda port: fake_config(pids, "--trap-term", port=port, stop_grace=30.0))
    leader = server.state().record.leader

    t = time.monotonic()
    report = stop_run(server.run_dir, deadline=3.0)
    took = time.monotonic() - t

    assert took <= 3.0 + SLACK_S, (took, report)  # the deadline, not the 30 s grace
    assert report.escalated
    assert report.step("sigkill") is not None
    assert "still alive" in report.step("grace").outcome
    assert report.verdict == "clean", report
    assert gone(leader.pid, leader.create_time)
    assert not report.port_open


def test_stop_never_exceeds_deadline_plus_one_poll_with_term_ignoring_child(launcher, tmp_path):
    pids = tmp_path / "pids"
    server = launcher.launch(lambda port: fake_config(pids, "--child-ignores-term", port=port))
    child = read_pid(pids, "child")
    child_ct = psutil.Process(child).create_time()
    deadline = 2.0

    t = time.monotonic()
    report = stop_run(server.run_dir, deadline=deadline, grace=60.0)
    took = time.monotonic() - t

    assert took <= deadline + SLACK_S, (took, report)  # the deadline, not the 60 s grace
    assert report.total_s <= deadline + SLACK_S
    assert report.escalated
    assert gone(child, child_ct)
    assert report.verdict == "clean", report


def test_reparented_double_forked_workers_are_killed_via_recorded_descendants(launcher, tmp_path):
    pids = tmp_path / "pids"
    server = launcher.launch(lambda port: fake_config(pids, "--double-fork", "--intermediate-life", "1.5",
                                                      port=port), record_interval=0.25)
    w1 = read_pid(pids, "w1")
    w2 = read_pid(pids, "w2")
    wait_for(lambda: (pids / "w2.setsid").exists(), 15, "w2 to leave the group")
    leader = server.state().record.leader
    w1p, w2p = psutil.Process(w1), psutil.Process(w2)
    w1_ct, w2_ct = w1p.create_time(), w2p.create_time()
    # The scenario: both reparented away from the server; w2 also left its group and session.
    assert w1p.ppid() != leader.pid and w2p.ppid() != leader.pid
    assert os.getpgid(w2) != leader.pid and os.getsid(w2) != leader.pid
    recorded = {d.pid for d in server.state().descendants}
    assert w2 in recorded  # recorded while its intermediate parent still lived

    report = server.shutdown()

    assert report is not None and report.verdict == "clean", report
    assert gone(w1, w1_ct) and gone(w2, w2_ct) and gone(leader.pid, leader.create_time)


def test_crash_during_startup_raises_with_log_tail_and_leaves_nothing(launcher, tmp_path):
    pids = tmp_path / "pids"
    with pytest.raises(LaunchError) as info:
        launcher.launch(lambda port: fake_config(pids, "--crash", port=port))
    err = info.value
    assert err.reason in ("fatal_log", "exited")
    assert "cannot load weights" in err.log_tail
    assert "RuntimeError: fake-engine: start-up failed on purpose" in err.log_tail
    assert err.log_path and Path(err.log_path).name == "server.log"
    server = launcher.servers[-1]
    crash_child = read_pid(pids, "crash-child", timeout=1)
    leader = server.state().record.leader
    assert gone(crash_child) and gone(leader.pid, leader.create_time)
    assert server.stop_report is not None and server.stop_report.verdict == "clean"
    assert server.state().status is RunStatus.STOPPED


def test_bystander_and_reused_pid_are_never_signalled(launcher, tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True)
    try:
        b = psutil.Process(bystander.pid)
        pids = tmp_path / "pids"
        server = launcher.launch(lambda port: fake_config(pids, "--trap-term", port=port),
                                 record_interval=3600)  # no pruning of the planted entry
        # Make the record list the bystander's pid with another create time, as if the pid had
        # been reused since it was recorded: the stop must not touch it.
        fake = ProcessRef(bystander.pid, b.create_time() - 1000.0, "reused")
        server.state_file.add_descendants([fake])
        assert any(d.pid == bystander.pid for d in server.state().descendants)

        report = stop_run(server.run_dir, deadline=3.0, grace=0.5)

        assert report.escalated and report.verdict == "clean", report
        assert b.is_running() and b.status() != psutil.STATUS_ZOMBIE
        assert bystander.poll() is None
    finally:
        bystander.terminate()
        bystander.wait(10)


def test_port_taken_refused_before_launch(tmp_path):
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        server = Server(fake_config(tmp_path / "pids", port=port), run_dir=tmp_path / "run",
                        preflight=TEST_PREFLIGHT)
        with pytest.raises(PreflightFailed) as info:
            server.launch()
        failed = [r for r in info.value.results if not r.passed]
        assert [r.rule for r in failed] == ["port"]
        assert str(port) in failed[0].detail
        assert server.pid is None
        assert not (tmp_path / "run" / "launch.json").exists()
        assert not (tmp_path / "pids" / "server.pid").exists()  # never spawned
        assert server.shutdown() is None
    finally:
        holder.close()


def test_failed_preflight_refuses_unless_forced(launcher, tmp_path):
    impossible = TEST_PREFLIGHT.model_copy(update={"min_disk_free_gib": 1e9})
    with pytest.raises(PreflightFailed) as info:
        launcher.launch(lambda port: fake_config(tmp_path / "refused", port=port), preflight=impossible)
    assert [r.rule for r in info.value.results if not r.passed] == ["disk"]
    assert not (tmp_path / "refused" / "server.pid").exists()

    seen = []
    server = launcher.launch(lambda port: fake_config(tmp_path / "forced", port=port), preflight=impossible,
                             force=True, on_preflight=seen.append)
    assert server.state().status is RunStatus.READY
    assert [r.rule for r in seen[0].failures] == ["disk"]  # still reported


def test_readiness_deadline_then_cleanup(launcher, tmp_path):
    pids = tmp_path / "pids"
    t = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launcher.launch(lambda port: fake_config(pids, "--ready-after", "60", port=port, ready_timeout=2.0))
    assert info.value.reason == "timeout"
    assert time.monotonic() - t < 2.0 + 20.0
    leader = launcher.servers[-1].state().record.leader
    assert gone(leader.pid, leader.create_time)


def test_async_context_manager_stops_on_exit(tmp_path):
    async def main() -> tuple[Server, int]:
        for _ in range(4):
            cfg = fake_config(tmp_path / "pids", port=free_port())
            server = Server(cfg, run_dir=tmp_path / f"run-{cfg.port}", preflight=TEST_PREFLIGHT)
            try:
                async with server as s:
                    transport = AiohttpTransport(max_connections=1)
                    try:
                        assert (await transport.request("GET", s.url + "/health", timeout=10)).status == 200
                    finally:
                        await transport.aclose()
                    return s, s.pid
            except PreflightFailed:
                continue
        raise AssertionError("no free port")

    server, pid = asyncio.run(main())
    assert server.stop_report is not None and server.stop_report.verdict == "clean"
    assert gone(pid)
    assert asyncio.run(server.stop()) is server.stop_report


def test_stop_after_the_launcher_lost_track_leaves_unproven_group_members(launcher, tmp_path):
    """The leader exits on SIGTERM from outside (reaped), a worker it left in the group survives,
    never recorded. Nothing recorded is alive, so nothing proves the group is still ours (a
    double-forking process given the leader's reused pid looks the same): the stop signals
    nothing, names what it found, and the worker survives it."""
    pids = tmp_path / "pids"
    server = launcher.launch(lambda port: fake_config(pids, "--child-ignores-term", port=port),
                             record_interval=3600)
    child = read_pid(pids, "child")
    child_ct = psutil.Process(child).create_time()
    state = server.state()
    assert all(d.pid != child for d in state.descendants)  # never recorded (recorder too slow)
    os.kill(server.pid, signal.SIGTERM)  # the test's own server, by its pid
    server._popen.wait(10)  # the leader is reaped: nothing recorded is alive any more
    assert not gone(child, child_ct)
    try:
        report = stop_run(server.run_dir, deadline=5.0, grace=0.5)

        sigterm = report.step("sigterm")
        assert sigterm is not None and "not sent" in sigterm.outcome and str(child) in sigterm.outcome, report
        assert not gone(child, child_ct)  # not signalled: not proven ours
    finally:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(child)
            if abs(p.create_time() - child_ct) < 0.05:  # the test's own worker, verified by create time
                p.kill()
                p.wait(10)


def test_openai_endpoint_is_checked_but_never_launched_or_stopped(launcher, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    backend = launcher.launch(lambda port: fake_config(pids, "--key-echo", "k-123", port=port))
    leader = backend.state().record.leader

    monkeypatch.setenv("ENDPOINT_KEY", "k-123")
    endpoint = Server(ServerConfig(engine="openai", base_url=backend.url + "/v1", api_key_env="ENDPOINT_KEY",
                                   ready_timeout=10.0), run_dir=tmp_path / "endpoint")
    assert endpoint.launch().ready is not None
    assert endpoint.pid is None and not (tmp_path / "endpoint").exists()
    assert endpoint.shutdown() is None
    assert not gone(leader.pid, leader.create_time)  # the endpoint's server was left alone

    monkeypatch.setenv("ENDPOINT_KEY", "wrong")
    refused = Server(ServerConfig(engine="openai", base_url=backend.url, api_key_env="ENDPOINT_KEY",
                                  ready_timeout=1.0))
    with pytest.raises(LaunchError) as info:
        refused.launch()
    assert info.value.reason == "timeout"
    assert not gone(leader.pid, leader.create_time)
