"""The verified stop of a server harvest launched, from its state file alone.

    record    read the launch record; add descendants alive now (children, group and session members)
    sigterm   SIGTERM to the recorded process group (if still ours) and to recorded processes outside it;
              SIGCONT after it to those that are stopped (SIGSTOP), so they can act on it
    grace     wait for every recorded process to exit (bounded by the grace and the budget)
    sigkill   SIGKILL to the group and to every recorded process still alive with its create time
    reap      wait for them to be gone (bounded)
    gpu       poll GPU memory every 0.1 s until each GPU the server used is back within a margin of
              its pre-launch baseline, or the budget ends; then name the holders still there (every
              probe call is bounded by the budget: a wedged driver cannot hold the stop)
    port      check the server's port can be bound again (nothing holds it any more), else name
              the processes listening on it

Every step gets what is left of one deadline, and no wait inside a step is longer than one poll
interval past it, so a stop's own budget ends at the deadline plus one poll interval (on a loaded
machine the scheduler adds its delays to the wall clock on top); a step that runs out of time moves
on to the next and is never retried. Usable from any
process (``harvest stop`` in another shell, also after the launching process was killed).

It signals only the recorded process group and recorded (pid, create time) pairs, rechecked right
before each signal; it never looks a process up by name and never infers state from a signal
having been sent: every verdict comes from a measurement.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import psutil

from harvest.errors import ProbeError, StopError, UnsafePathError
from harvest.gpu.records import GpuProbe
from harvest.safefiles import Folder
from harvest.server import procs
from harvest.server.state import ProcessRef, RunState, RunStatus, StateFile
from harvest.stops import DEFAULT_MARGIN_MIB, Holder, StopReport, StopStep, Verdict

#: GPU memory is polled at this interval (10 Hz); also the slack a stop may overrun its deadline by.
POLL_INTERVAL = 0.1
#: Part of the budget kept back from the grace period for SIGKILL and verification.
KILL_RESERVE_S = 5.0
#: Part of the budget kept for the final port check.
PORT_RESERVE_S = 0.3


class _Steps(list[StopStep]):
    """The steps of one stop; tells ``on_step(name, step)`` when a step begins (step None) and
    when it ends (the finished StopStep). A listener's error never changes the stop."""

    def __init__(self, on_step: Callable[[str, StopStep | None], None] | None):
        super().__init__()
        self.on_step = on_step

    def begin(self, name: str) -> None:
        self._tell(name, None)

    def append(self, step: StopStep) -> None:
        super().append(step)
        self._tell(step.name, step)

    def _tell(self, name: str, step: StopStep | None) -> None:
        if self.on_step is not None:
            with contextlib.suppress(Exception):
                self.on_step(name, step)


def _begin(steps: list[StopStep], name: str) -> None:
    if isinstance(steps, _Steps):
        steps.begin(name)


class _Clock:
    def __init__(self, t0: float, deadline_s: float):
        self.t0 = t0
        self.end = t0 + deadline_s

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def since(self, t: float) -> float:
        return round(time.monotonic() - t, 3)


T = TypeVar("T")


def _bounded(call: Callable[[], T], seconds: float, what: str) -> T:
    """``call()`` on a helper thread, given at most ``seconds`` to answer: a wedged GPU makes NVML
    calls block, and no wait of a stop may be unbounded. On time out raises ProbeError; the
    blocked call is left behind on its daemon thread (it cannot be interrupted)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name="harvest-stop-probe", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        raise ProbeError(f"{what} did not answer within {seconds:.1f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _wait_gone(refs: Sequence[ProcessRef], seconds: float, poll: float) -> list[ProcessRef]:
    """Poll until none of ``refs`` is alive or ``seconds`` pass; returns those still alive."""
    until = time.monotonic() + max(0.0, seconds)
    while True:
        left = procs.alive(refs)
        now = time.monotonic()
        if not left or now >= until:
            return left
        time.sleep(min(poll, until - now))


def _names(refs: Sequence[ProcessRef]) -> str:
    shown = ", ".join(procs.describe(r) for r in refs[:8])
    return shown + (f" and {len(refs) - 8} more" if len(refs) > 8 else "")


def _record_step(sf: StateFile, state: RunState) -> tuple[RunState, StopStep]:
    t = time.monotonic()
    try:
        state = sf.update(lambda s: replace(s, status=RunStatus.STOPPING))
        found = procs.discover(state)
        if found:
            state = sf.add_descendants(found)
    except (OSError, StopError, UnsafePathError) as exc:  # a read-only or refused record: go on
        found = procs.discover(state)
        state = replace(state, descendants=state.descendants + tuple(found))
        note = f" (state file not updated: {exc})"
    else:
        note = ""
    live = procs.alive(state.processes())
    outcome = (f"{len(state.processes())} processes recorded (leader {state.record.pid}, group "
               f"{state.record.pgid}), {len(live)} alive{note}")
    return state, StopStep("record", round(time.monotonic() - t, 3), outcome)


def _continue_stopped(state: RunState, live: Sequence[ProcessRef], in_group: bool) -> list[str]:
    """SIGCONT after the SIGTERM, to the group and the recorded processes that are stopped (a
    SIGSTOP, a debugger, a terminal's job control): a stopped process acts on SIGTERM only once
    continued, so without it a frozen engine would wait out the grace period for its SIGKILL.
    A cgroup frozen by its freezer stays frozen: SIGKILL after the grace still ends it."""
    stopped = [r for r in live if (p := procs.verified(r)) is not None and _is_stopped(p)]
    if not stopped:
        return []
    if in_group:
        procs.signal_group(state, signal.SIGCONT)
    sent = procs.signal_verified([r for r in stopped if _pgid(r) != state.record.pgid or not in_group],
                                 signal.SIGCONT)
    return [f"SIGCONT to {len(stopped)} stopped process(es) ({_names(stopped)})"
            + ("" if in_group or sent else ": not sent")]


def _is_stopped(p: psutil.Process) -> bool:
    try:
        return p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _terminate(sf: StateFile, state: RunState, clock: _Clock, grace: float, poll: float,
               steps: list[StopStep]) -> tuple[bool, RunState]:
    """SIGTERM, grace, SIGKILL, reap. Returns whether SIGKILL was needed, and the state with any
    worker recorded on the way."""
    refs = state.processes()
    live = procs.alive(refs)
    if not live:
        steps.append(StopStep("sigterm", 0.0, "not sent: no recorded process alive ("
                              + procs.group_findings(state) + ")"))
        return False, state

    t = time.monotonic()
    in_group = procs.signal_group(state, signal.SIGTERM)
    outside = [r for r in live if _pgid(r) not in (None, state.record.pgid)]
    sent_outside = procs.signal_verified(outside, signal.SIGTERM)
    what = [f"group {state.record.pgid}" if in_group else "group gone or no longer ours: not signalled"]
    if sent_outside:
        what.append(f"{len(sent_outside)} recorded process(es) outside the group: {_names(sent_outside)}")
    what += _continue_stopped(state, live, in_group)
    steps.append(StopStep("sigterm", clock.since(t), "sent to " + "; ".join(what)))

    t = time.monotonic()
    _begin(steps, "grace")
    budget = clock.remaining()
    reserve = min(budget / 2, KILL_RESERVE_S)
    wait = min(grace, max(0.0, budget - reserve))
    left = _wait_gone(refs, wait, poll)
    if not left:
        steps.append(StopStep("grace", clock.since(t), f"all exited after {clock.since(t):.2f} s"))
        return False, state
    limited = " (cut short by the deadline)" if wait < grace else ""
    steps.append(StopStep("grace", clock.since(t),
                          f"{len(left)} still alive after {clock.since(t):.2f} s{limited}: {_names(left)}"))

    t = time.monotonic()
    _begin(steps, "sigkill")
    # Workers spawned during the grace period are recorded (in the file, when writable) before the kill.
    late = [r for r in procs.discover(state) if not any(r.pid == k.pid for k in refs)]
    if late:
        try:
            state = sf.add_descendants(late)
        except (OSError, StopError, UnsafePathError):
            state = replace(state, descendants=state.descendants + tuple(late))
    refs = state.processes()
    in_group = procs.signal_group(state, signal.SIGKILL)
    killed = procs.signal_verified(procs.alive(refs), signal.SIGKILL)
    what = [f"group {state.record.pgid}" if in_group else "group gone or no longer ours: not signalled"]
    what.append(f"{len(killed)} recorded process(es): {_names(killed)}" if killed else "no recorded process")
    steps.append(StopStep("sigkill", clock.since(t), "sent to " + "; ".join(what)))

    t = time.monotonic()
    _begin(steps, "reap")
    left = _wait_gone(refs, max(0.0, clock.remaining() - PORT_RESERVE_S), poll)
    if left:
        steps.append(StopStep("reap", clock.since(t), f"still alive at the deadline: {_names(left)}", ok=False))
    else:
        steps.append(StopStep("reap", clock.since(t), f"all gone after {clock.since(t):.2f} s"))
    return True, state


def _pgid(ref: ProcessRef) -> int | None:
    p = procs.verified(ref)
    if p is None:
        return None
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def _drain_gpus(state: RunState, probe: GpuProbe | None, clock: _Clock, margin: int, poll: float,
                steps: list[StopStep], problems: list[str]) -> tuple[dict[int, int], tuple[Holder, ...]]:
    rec = state.record
    gpus = list(rec.gpus)
    if not gpus:
        steps.append(StopStep("gpu", 0.0, "no GPU recorded for this server"))
        return {}, ()
    t = time.monotonic()
    until = t + max(0.0, clock.remaining() - PORT_RESERVE_S)

    def budget() -> float:  # each probe call gets what is left of the step (at least one poll)
        return max(until - time.monotonic(), poll)

    own_probe = probe is None
    final: dict[int, int] = {}
    try:
        if probe is None:
            from harvest.gpu import open_probe

            probe = _bounded(open_probe, budget(), "opening the GPU probe")
        gpu_probe = probe
        polls = 0
        while True:
            final = _bounded(lambda: gpu_probe.memory_used(gpus), budget(), "the GPU probe")
            polls += 1
            over = {g: final[g] - rec.baseline_mib.get(g, 0) for g in gpus
                    if final[g] > rec.baseline_mib.get(g, 0) + margin}
            now = time.monotonic()
            if not over or now >= until:
                break
            time.sleep(min(poll, until - now))
        holders = _bounded(lambda: _holders(state, gpu_probe, gpus), budget(), "the GPU probe")
    except ProbeError as exc:
        steps.append(StopStep("gpu", clock.since(t), f"measurement failed: {exc}", ok=False))
        problems.append(f"GPU memory could not be measured: {exc}")
        return final, ()
    finally:
        if own_probe and probe is not None:
            with contextlib.suppress(ProbeError):
                _bounded(probe.close, poll, "closing the GPU probe")
    shown = ", ".join(f"GPU {g}: {final[g]} MiB (baseline {rec.baseline_mib.get(g, 0)})" for g in gpus)
    if over:
        steps.append(StopStep("gpu", clock.since(t), f"not back within {margin} MiB after {polls} polls: {shown}",
                              ok=False))
        problems.append("GPU memory above baseline: " + ", ".join(f"GPU {g} +{d} MiB" for g, d in over.items()))
    else:
        steps.append(StopStep("gpu", clock.since(t), f"back within {margin} MiB of baseline after {polls} "
                              f"poll(s): {shown}"))
    ours = [h for h in holders if h.ours]
    if ours:
        problems.append("our processes still hold GPU memory: " +
                        ", ".join(f"pid {h.pid} on GPU {h.gpu}" for h in ours))
    return final, holders


def _holders(state: RunState, probe: GpuProbe, gpus: list[int]) -> tuple[Holder, ...]:
    snap = probe.snapshot()
    recorded = state.processes()
    out: list[Holder] = []
    for gpu in snap.gpus:
        if gpu.index not in gpus:
            continue
        for p in gpu.processes:
            ours = p.visible and any(r.pid == p.pid and procs.verified(r) is not None for r in recorded)
            out.append(Holder(gpu.index, p.pid, p.name, p.used_mib, ours))
    return tuple(out)


def _port_holders(port: int) -> tuple[ProcessRef, ...]:
    """The processes listening on ``port`` now, as far as this user can see them (named, never
    signalled: one that is not in the record is not provably ours)."""
    from harvest.net import listening_pids

    refs = []
    for pid in listening_pids(port):
        try:
            ref = procs.ref_of(psutil.Process(pid))
        except psutil.Error:  # gone since
            continue
        if ref is not None:
            refs.append(ref)
    return tuple(refs)


def _wait_port_closed(host: str, port: int, clock: _Clock, poll: float) -> tuple[bool, int]:
    """Check until the port can be bound again or the budget ends (at least one check).

    A bind check, not a connect: a listener that never accepts fills its backlog, after which
    connects time out and would read as "closed". A killed server's sockets close when its last
    thread has exited, which can trail its main thread by a moment. Returns (still in use, checks).
    """
    from harvest.net import port_bindable

    checks = 0
    while True:
        in_use = not port_bindable(host, port)
        checks += 1
        if not in_use or clock.remaining() <= 0:
            return in_use, checks
        time.sleep(min(poll, clock.remaining()))


def _read(sf: StateFile, known: RunState | None) -> RunState:
    """The record in the file; ``known`` (the launcher's own copy) when the file cannot be read."""
    try:
        return sf.read()
    except StopError:
        if known is None:
            raise
        return known


def stop_run(
    run_dir: Path | str | Folder,
    *,
    deadline: float | None = None,
    grace: float | None = None,
    probe: GpuProbe | None = None,
    margin_mib: int = DEFAULT_MARGIN_MIB,
    poll_interval: float = POLL_INTERVAL,
    on_step: Callable[[str, StopStep | None], None] | None = None,
    known: RunState | None = None,
) -> StopReport:
    """Stop the server recorded in ``run_dir`` and measure that it is gone.

    ``deadline``/``grace`` default to the values recorded at launch. ``probe`` measures GPU memory
    (opened and closed here when None and the record lists GPUs). Raises :class:`StopError` only
    when there is no readable launch record; everything else ends up in the report.
    ``on_step(name, step)`` hears each step begin (step None) and end (its StopStep), as it happens.
    ``known``: the record as the launching process wrote it, stopped by when the file cannot be read
    back (refused since, or never written: a refusal right after the spawn); nothing the stop
    writes then is required to succeed.
    """
    if poll_interval <= 0 or poll_interval > POLL_INTERVAL:
        raise ValueError(f"poll_interval must be in (0, {POLL_INTERVAL}] s (>= 10 Hz), got {poll_interval}")
    t0 = time.monotonic()
    sf = StateFile(run_dir)  # a Folder: the one the launch held; a path: held here, once
    state = _read(sf, known)
    rec = state.record
    deadline = rec.stop_deadline if deadline is None else deadline
    # A process frozen while it holds the state file's lock costs a tenth of the budget per write.
    sf.lock_timeout = max(poll_interval, min(1.0, deadline / 10))
    grace = rec.stop_grace if grace is None else grace
    if deadline <= 0:
        raise StopError(f"stop deadline must be > 0 s, got {deadline}")
    clock = _Clock(t0, deadline)
    steps = _Steps(on_step)
    problems: list[str] = []

    steps.begin("record")
    state, step = _record_step(sf, state)
    steps.append(step)
    steps.begin("sigterm")
    escalated, state = _terminate(sf, state, clock, grace, poll_interval, steps)

    survivors = tuple(procs.alive(state.processes()))
    if survivors:
        problems.append(f"recorded processes still alive: {_names(list(survivors))}")

    steps.begin("gpu")
    final_mib, holders = _drain_gpus(state, probe, clock, margin_mib, poll_interval, steps, problems)

    t = time.monotonic()
    steps.begin("port")
    port_open, checks = _wait_port_closed(rec.host, rec.port, clock, poll_interval)
    steps.append(StopStep("port", clock.since(t), f"port {rec.port} " + (
        f"still in use after {checks} check(s)" if port_open else "closed (bindable again)"), ok=not port_open))
    port_holders: tuple[ProcessRef, ...] = ()
    if port_open:
        port_holders = _port_holders(rec.port)
        held_by = ", ".join(f"pid {r.pid} ({r.name or '?'})" for r in port_holders)
        problems.append(f"port {rec.port} is still in use" + (f" by {held_by}" if held_by else
                                                              " (no listening process visible here)"))

    verdict: Verdict = "dirty" if problems else "clean"
    report = StopReport(
        run_dir=str(sf.run_dir), verdict=verdict, steps=tuple(steps), escalated=escalated,
        baseline_mib=dict(rec.baseline_mib), final_mib=final_mib, holders=holders, survivors=survivors,
        port_open=port_open, port_holders=port_holders, total_s=round(time.monotonic() - clock.t0, 3),
        deadline_s=deadline, problems=tuple(problems), engine=rec.engine, pid=rec.pid,
    )
    # The report itself is the result; a read-only run folder or a stuck lock does not change it.
    sf.lock_timeout = poll_interval
    with contextlib.suppress(OSError, StopError, UnsafePathError):
        sf.write_stop_report(report.to_dict())
    with contextlib.suppress(OSError, StopError, UnsafePathError):
        sf.set_status(RunStatus.STOPPED if report.clean else RunStatus.DIRTY)
    sf.close()
    return report


__all__ = ["DEFAULT_MARGIN_MIB", "POLL_INTERVAL", "Holder", "StopReport", "StopStep", "stop_run"]
