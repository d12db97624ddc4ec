"""The GPU part of a stop through the probe seam: memory polled at >= 10 Hz back to the pre-launch
baseline, holders named, and a dirty verdict (inside the deadline) when memory stays taken.

The engine is the real fake_engine.py process; only the GPU is simulated, by a probe whose memory
follows the engine: held while the engine lives, released a moment after it is gone.
"""

from __future__ import annotations

import time

import psutil

from harvest.gpu.records import GpuProcess, GpuSnapshot, GpuState
from harvest.server import stop_run
from harvest.server.stop import DEFAULT_MARGIN_MIB, POLL_INTERVAL
from tests.server.helpers import fake_config, gone
from tests.timing import SLACK_S

BASELINE = 615  # NVML v1 counts driver-reserved memory: compare to a baseline, never to zero
HELD = 40_000


class EngineFollowingProbe:
    """A GpuProbe for GPU 0 whose memory is held while ``pid`` lives and for ``release_s`` after."""

    source = "nvml"

    def __init__(self, release_s: float, foreign_pid: int | None = None, never_release: bool = False):
        self.pid: int | None = None
        self.release_s = release_s
        self.foreign_pid = foreign_pid
        self.never_release = never_release
        self.gone_at: float | None = None
        self.polls: list[float] = []

    def _used(self) -> int:
        if self.pid is None or self.never_release:
            return BASELINE if self.pid is None else BASELINE + HELD
        if self.gone_at is None and gone(self.pid):
            self.gone_at = time.monotonic()
        if self.gone_at is not None and time.monotonic() - self.gone_at >= self.release_s:
            return BASELINE + 3
        return BASELINE + HELD

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        self.polls.append(time.monotonic())
        return {i: self._used() for i in indices}

    def snapshot(self) -> GpuSnapshot:
        used = self._used()
        procs = []
        if self.foreign_pid is not None:
            procs.append(GpuProcess(self.foreign_pid, "someone-else", 1024))
        if self.pid is not None and not gone(self.pid):
            procs.append(GpuProcess(self.pid, "python", HELD))
        gpu = GpuState(index=0, uuid="GPU-fake", name="Fake H200", total_mib=143_771, used_mib=used,
                       free_mib=143_771 - used, reserved_mib=None, utilization_pct=0, processes=tuple(procs))
        return GpuSnapshot(source="nvml", gpus=(gpu,))

    def close(self) -> None:
        pass


def test_stop_polls_gpu_memory_back_to_baseline(launcher, tmp_path):
    probe = EngineFollowingProbe(release_s=0.8)
    server = launcher.launch(lambda port: fake_config(tmp_path / "pids", port=port, gpus=[0]), probe=probe)
    rec = server.state().record
    assert rec.gpus == (0,) and rec.baseline_mib == {0: BASELINE}
    probe.pid = rec.pid
    probe.polls.clear()

    report = stop_run(server.run_dir, probe=probe, deadline=10.0)

    assert report.verdict == "clean", report
    assert report.final_mib == {0: BASELINE + 3} and report.baseline_mib == {0: BASELINE}
    gpu_step = report.step("gpu")
    assert gpu_step is not None and gpu_step.ok and "back within" in gpu_step.outcome
    assert gpu_step.duration_s >= 0.7  # it waited for the release, measured
    gaps = [b - a for a, b in zip(probe.polls, probe.polls[1:])]
    # Polled every POLL_INTERVAL while it waited: several polls over the 0.8 s release (one per
    # budget would be one or two), none of them a budget apart; the machine's load only stretches
    # each sleep, so the count is bounded by the wait and the gaps by one interval plus the slack.
    assert len(probe.polls) >= 4, probe.polls
    assert gaps and max(gaps) <= POLL_INTERVAL + SLACK_S, gaps
    assert sum(gaps) >= 0.7 and len(gaps) <= sum(gaps) / POLL_INTERVAL + 2, gaps  # no busy loop either
    assert report.holders == ()


def test_memory_that_stays_taken_is_a_dirty_verdict_naming_holders(launcher, tmp_path):
    bystander = psutil.Process()  # the test process itself stands for a foreign GPU holder
    probe = EngineFollowingProbe(release_s=0.0, never_release=True)
    server = launcher.launch(lambda port: fake_config(tmp_path / "pids", port=port, gpus=[0]), probe=probe)
    rec = server.state().record
    probe.pid = rec.pid
    probe.foreign_pid = bystander.pid  # arrives after the launch (preflight would have refused it)
    deadline = 2.0

    t = time.monotonic()
    report = server.shutdown(deadline=deadline)  # the Server's stop uses the probe it launched with
    took = time.monotonic() - t

    assert took <= deadline + SLACK_S, took
    assert report.verdict == "dirty"
    assert not report.step("gpu").ok
    assert any("GPU 0" in p and f"+{HELD}" in p for p in report.problems)
    assert [(h.pid, h.ours) for h in report.holders] == [(bystander.pid, False)]
    assert gone(rec.pid, rec.create_time)  # the server itself did stop
    assert DEFAULT_MARGIN_MIB < HELD
