"""R3: stops that fight back, beyond what tests/server and tests/cli/test_serve.py already cover
(a TERM-ignoring child, reparented grandchildren, a bystander, `harvest serve` SIGKILLed then
`harvest stop` from another shell; `harvest run` SIGKILLed is in test_client_kills.py).

Here a step of the stop itself hangs, and the stop must still return within its deadline:
- the engine sits behind a container-exec-like prefix that never returns: harvest kills the prefix,
  the real server (a llama-server the prefix started outside harvest's reach) keeps the port; the
  report must say dirty and name the process that holds the port, and that process is not signalled;
- the GPU probe hangs (a wedged driver makes NVML calls block);
- the state file's lock is held by a process that is frozen (a launcher stopped mid-record).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from harvest.config import PreflightConfig, ServerConfig
from harvest.errors import LaunchError, PreflightFailed
from harvest.gpu.records import GpuSnapshot, GpuState
from harvest.net import port_bindable
from harvest.server import Server, StateFile, stop_run
from tests.engines import free_port
from tests.server.helpers import fake_config, gone, port_taken, wait_for
from tests.timing import SLACK_S, run_cli_timed

PREFIX = Path(__file__).with_name("exec_prefix.py")
TEST_PREFLIGHT = PreflightConfig(min_disk_free_gib=0.05, ram_reserve_gib=0)
BASELINE = 615
TOTAL = 143_771


class IdleGpu:
    """A GpuProbe of one idle GPU 0 (launch baseline and preflight), answering at once."""

    source = "nvml"

    def snapshot(self) -> GpuSnapshot:
        gpu = GpuState(index=0, uuid="GPU-idle", name="Fake H200", total_mib=TOTAL, used_mib=BASELINE,
                       free_mib=TOTAL - BASELINE, reserved_mib=None, utilization_pct=0)
        return GpuSnapshot(source="nvml", gpus=(gpu,))

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        return {i: BASELINE for i in indices}

    def close(self) -> None:
        pass


class HungGpu(IdleGpu):
    """A probe whose every query blocks, as NVML does on a wedged GPU (released at teardown)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def snapshot(self) -> GpuSnapshot:
        self.calls += 1
        self.release.wait(120)
        return super().snapshot()

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        self.calls += 1
        self.release.wait(120)
        return super().memory_used(indices)


def _launch(tmp_path: Path, make: Callable[[int], ServerConfig], **kwargs: object) -> Server:
    for attempt in range(4):  # a port taken between choosing and binding: choose again
        server = Server(make(free_port()), run_dir=tmp_path / f"run{attempt}", preflight=TEST_PREFLIGHT,
                        **kwargs)  # type: ignore[arg-type]
        try:
            return server.launch()
        except (LaunchError, PreflightFailed) as exc:
            if not port_taken(exc) or attempt == 3:
                raise
    raise AssertionError("unreachable")


def _stop_in_thread(run_dir: Path, **kwargs) -> tuple[object, float]:
    """stop_run in a thread, so a hang shows as a failed assertion instead of a stuck test."""
    box: dict[str, object] = {}

    def target() -> None:
        t = time.monotonic()
        try:
            box["report"] = stop_run(run_dir, **kwargs)
        except BaseException as exc:  # re-raised below, in the test's thread
            box["error"] = exc
        box["took"] = time.monotonic() - t

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(kwargs.get("deadline", 10) + 15)
    assert not thread.is_alive(), "the stop hung past its deadline"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["report"], box["took"]  # type: ignore[return-value]


def test_hanging_gpu_probe_does_not_hold_the_stop_past_its_deadline(tmp_path):
    pids = tmp_path / "pids"
    server = _launch(tmp_path, lambda port: fake_config(pids, port=port, gpus=[0], stop_grace=5.0),
                     probe=IdleGpu())
    rec = server.state().record
    assert rec.gpus == (0,) and rec.baseline_mib == {0: BASELINE}
    hung = HungGpu()
    deadline = 3.0
    try:
        report, took = _stop_in_thread(server.run_dir, probe=hung, deadline=deadline)
    finally:
        hung.release.set()
        server.shutdown()

    assert took <= deadline + SLACK_S, (took, report)
    assert hung.calls >= 1  # it did try to measure
    assert report.verdict == "dirty"  # GPU memory was not measured: never assumed clean
    gpu = report.step("gpu")
    assert gpu is not None and not gpu.ok and "did not answer" in gpu.outcome, gpu
    assert any("GPU memory could not be measured" in p for p in report.problems), report.problems
    assert gone(rec.pid, rec.create_time)  # the processes were stopped all the same
    assert not report.port_open


def test_state_file_lock_held_by_a_frozen_process_does_not_hang_harvest_stop(tmp_path):
    pids = tmp_path / "pids"
    server = _launch(tmp_path, lambda port: fake_config(pids, port=port), record_interval=3600)
    rec = server.state().record
    lock_path = server.run_dir / ".launch.json.lock"
    # A process that took the state file's lock and froze (a launcher stopped mid-record).
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(120)\n",
         str(lock_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        deadline = 3.0
        out, took, startup = run_cli_timed([sys.executable, "-m", "harvest", "stop", str(server.run_dir), "--json",
                                            "--deadline", str(deadline), "--grace", "1"], timeout=30)
    finally:
        holder.kill()  # the test's own child, by its pid
        holder.wait(10)
        server.shutdown()

    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    (report,) = doc["servers"]  # harvest.stop/1: one report per server
    assert doc["verdict"] == report["verdict"] == "clean", doc
    assert report["total_s"] <= deadline + SLACK_S
    # the lock was not waited for: the command took its stop's deadline and its own start-up
    assert took <= deadline + SLACK_S + 2 * startup, (took, startup)
    assert "state file not updated" in report["steps"][0]["outcome"]
    assert gone(rec.pid, rec.create_time)


def _escaped_engine(pids: Path, since: float, model: Path) -> psutil.Process | None:
    """The live llama-server this test's prefix started: named in engine.pid, serving the test's
    model, created after the test began (so a reused pid is never taken for it)."""
    try:
        p = psutil.Process(int((pids / "engine.pid").read_text()))
        if p.create_time() >= since - 1 and str(model) in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
            return p
    except (OSError, ValueError, psutil.Error):
        pass
    return None


@pytest.mark.engine
def test_engine_behind_an_exec_prefix_that_never_returns(tmp_path, llama_server_bin, tiny_gguf):
    pids = tmp_path / "pids"
    pids.mkdir()
    started = time.time()
    run_dir = tmp_path / "run"
    port = free_port()
    cfg = ServerConfig(engine="llamacpp", model=str(tiny_gguf), port=port,
                       command=[sys.executable, str(PREFIX), "--pid-dir", str(pids), "--", llama_server_bin],
                       extra_args=["-c", "4096"], ready_timeout=60, stop_grace=1.0, stop_deadline=5.0)
    server = Server(cfg, run_dir=run_dir, preflight=TEST_PREFLIGHT, record_interval=0.25)
    try:
        server.launch()
        engine = wait_for(lambda: _escaped_engine(pids, started, tiny_gguf), 10, "the engine behind it")
        engine_pid = engine.pid
        prefix = server.state().record.leader
        server.detach()  # from here on, only `harvest stop` in another process acts

        out, took, startup = run_cli_timed([sys.executable, "-m", "harvest", "stop", str(run_dir), "--json"],
                                           timeout=60)

        assert out.returncode == 1, out.stdout + out.stderr  # dirty
        doc = json.loads(out.stdout)
        (report,) = doc["servers"]  # harvest.stop/1: one report per server
        assert doc["verdict"] == "dirty"
        assert report["verdict"] == "dirty" and report["escalated"] is True  # the prefix ignored SIGTERM
        assert report["total_s"] <= cfg.stop_deadline + SLACK_S
        assert took <= cfg.stop_deadline + SLACK_S + 2 * startup, (took, startup)  # the hung prefix was not waited
        assert gone(prefix.pid, prefix.create_time)
        assert report["port_open"] is True
        named = " ".join(report["problems"])
        assert f"pid {engine_pid} (llama-server)" in named, report["problems"]
        assert [h["pid"] for h in report["port_holders"]] == [engine_pid]
        # Never signalled: harvest did not record it, so it cannot prove the process is its own.
        assert engine.is_running() and engine.status() != psutil.STATUS_ZOMBIE
        assert not port_bindable("127.0.0.1", port)
    finally:
        server.shutdown()
        leftover = _escaped_engine(pids, started, tiny_gguf)
        if leftover is not None:  # the llama-server the test's prefix started (psutil re-checks its identity)
            leftover.kill()
            leftover.wait(10)
        state = StateFile(run_dir)
        if state.exists():
            stop_run(run_dir, deadline=10)
