"""Measured process state of a launched server: which recorded processes are alive, and which
processes descend from it now.

A process is identified by (pid, create time): a pid whose create time differs from the recorded
one is another process that reused the number, and is treated as foreign. This module answers
questions and sends signals only through :func:`signal_group` and :func:`signal_verified`, which
accept recorded identities and re-check them right before sending. It never looks processes up by
name and never signals a pid that is not in a launch record.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Sequence

import psutil

from harvest.server.state import ProcessRef, RunState

#: Create times are compared with this tolerance (seconds): psutil derives them from boot time and
#: clock ticks, so two reads of one process agree to well under this.
CREATE_TIME_TOLERANCE = 0.05


def _same(p: psutil.Process, ref: ProcessRef) -> bool:
    try:
        return abs(p.create_time() - ref.create_time) <= CREATE_TIME_TOLERANCE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _finished_zombie(p: psutil.Process) -> bool:
    """A zombie whose threads have all exited. The main thread of a multi-threaded process can show
    as a zombie while its other threads still run their exit and hold its files (its sockets)."""
    if p.status() != psutil.STATUS_ZOMBIE:
        return False
    try:
        return p.num_threads() <= 1
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return True


def verified(ref: ProcessRef, *, include_zombies: bool = False) -> psutil.Process | None:
    """The live process that is ``ref`` (same pid and create time), else None.

    A finished zombie holds no resources and counts as gone unless ``include_zombies``.
    """
    try:
        p = psutil.Process(ref.pid)
        if not _same(p, ref):
            return None
        if not include_zombies and _finished_zombie(p):
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    except psutil.ZombieProcess:
        return None


def ref_of(p: psutil.Process) -> ProcessRef | None:
    try:
        with p.oneshot():
            return ProcessRef(p.pid, p.create_time(), p.name())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def alive(refs: Iterable[ProcessRef]) -> list[ProcessRef]:
    """The refs whose process is still running (zombies excluded)."""
    return [r for r in refs if verified(r) is not None]


def group_is_ours(state: RunState) -> bool:
    """True when the recorded process group is provably still the one harvest started: one
    recorded process (the leader or a recorded descendant), alive with its recorded create time
    (a zombie counts: it keeps its pid and group taken), sits in it now.

    Nothing else is proof. Once every recorded process is gone, the group number can be handed to
    a new process (pids wrap within hours where ``pid_max`` is 32768; a double-forking daemon that
    got the leader's pid makes a group and session of that number whose members were all created
    after the leader), so members that remain are not signalled: :func:`group_findings` says
    what is there instead.
    """
    pgid = state.record.pgid
    for ref in state.processes():
        p = verified(ref, include_zombies=True)
        if p is None:
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(p.pid) == pgid:
                return True
    return False


def group_findings(state: RunState) -> str:
    """What sits in the recorded group when no recorded process runs there, for a person to judge
    (never a reason to signal): what holds the leader's pid now (the leader itself, exited and not
    yet reaped; or another process that reused the number), and the members by pid and name."""
    rec = state.record
    recorded = state.processes()
    members: list[str] = []
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(p.pid) == rec.pgid and p.pid != rec.pid:  # the leader is said apart
                mine = next((r for r in recorded if r.pid == p.pid and _same(p, r)), None)
                members.append(f"{p.pid} ({p.name()}{', recorded, ' + _zombie_words(p) if mine else ''})")
    parts = [_pid_finding(rec.leader, "leader")]
    if members:
        proof = ("ours: a recorded process, exited, keeps it" if group_is_ours(state) else
                 "not proven ours (no recorded process with its create time among them)")
        parts.append(f"group {rec.pgid} holds {', '.join(members[:8])}"
                     + (f" and {len(members) - 8} more" if len(members) > 8 else "") + f", {proof}")
    return "; ".join(parts)


def _pid_finding(ref: ProcessRef, role: str) -> str:
    """What holds the recorded pid of ``ref`` now, in words: gone; the recorded process itself,
    exited and not yet reaped by its parent (a zombie keeps its pid and create time); or another
    process that reused the number (another create time)."""
    try:
        p = psutil.Process(ref.pid)
        with p.oneshot():
            created, name, zombie = p.create_time(), p.name(), p.status() == psutil.STATUS_ZOMBIE
    except psutil.ZombieProcess:  # a zombie whose create time cannot be read: not provably the one
        return f"pid {ref.pid} (the recorded {role}'s) has exited, not yet reaped; whether it is the recorded " \
               f"one cannot be read"
    except psutil.NoSuchProcess:
        return f"recorded {role} pid {ref.pid} is gone"
    except psutil.Error:
        return f"pid {ref.pid} exists; whether it is the recorded {role} cannot be read here"
    if abs(created - ref.create_time) > CREATE_TIME_TOLERANCE:
        when = "after" if created > ref.create_time else "before"
        return f"pid {ref.pid} is now another process ({name}, created {when} the recorded one)"
    if zombie:
        return f"recorded {role} pid {ref.pid} ({name}) has {_zombie_words(p)}"
    return f"recorded {role} pid {ref.pid} ({name}) is still there"


def _zombie_words(p: psutil.Process) -> str:
    """``exited, not yet reaped by its parent (pid 812, harvest)`` for a zombie; "" otherwise."""
    try:
        if p.status() != psutil.STATUS_ZOMBIE:
            return "running"
        parent = p.parent()
    except psutil.Error:
        return "exited, not yet reaped"
    by = f" by its parent (pid {parent.pid}, {_name(parent)})" if parent is not None else ""
    return f"exited, not yet reaped{by}"


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


def discover(state: RunState) -> list[ProcessRef]:
    """Processes that descend from the server now: children (recursive) of every live recorded
    process, plus members of its process group and session (workers that were reparented but did
    not leave them). Only looked for while the group is provably ours."""
    found: dict[int, ProcessRef] = {}
    roots = [p for p in (verified(r) for r in state.processes()) if p is not None]
    for root in roots:
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                ref = ref_of(child)
                if ref is not None:
                    found[ref.pid] = ref
    if group_is_ours(state):
        pgid = sid = state.record.pgid  # start_new_session: session id == group id == leader pid
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            try:
                if os.getpgid(p.pid) == pgid or os.getsid(p.pid) == sid:
                    ref = ref_of(p)
                    if ref is not None:
                        found[ref.pid] = ref
            except OSError:
                continue
    return [r for r in found.values() if r.pid != state.record.pid]


def signal_group(state: RunState, sig: int) -> bool:
    """Send ``sig`` to the recorded process group if it is still ours. Returns whether it was sent."""
    if not group_is_ours(state):
        return False
    try:
        os.killpg(state.record.pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def signal_verified(refs: Sequence[ProcessRef], sig: int) -> list[ProcessRef]:
    """Send ``sig`` to each recorded process still alive with its recorded create time.

    psutil re-checks the identity before sending, so a pid reused since the check is not hit.
    Returns the refs that were signalled.
    """
    sent: list[ProcessRef] = []
    for ref in refs:
        p = verified(ref)
        if p is None:
            continue
        try:
            p.send_signal(sig)
            sent.append(ref)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return sent


def describe(ref: ProcessRef) -> str:
    return f"{ref.pid} ({ref.name})" if ref.name else str(ref.pid)


SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGKILL: "SIGKILL", signal.SIGINT: "SIGINT"}

__all__ = [
    "CREATE_TIME_TOLERANCE",
    "alive",
    "describe",
    "discover",
    "group_findings",
    "group_is_ours",
    "ref_of",
    "signal_group",
    "signal_verified",
    "verified",
]
