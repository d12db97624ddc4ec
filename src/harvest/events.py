"""Phases of a long operation, reported to whoever watches: the seam between work and display.

    emit(on_event, "launching", "start", engine="vllm", pid=1234)

The runner, the supervisor, the stop and the sweep report what they are doing through an optional
listener (a plain callable taking an :class:`Event`); a display (the command line's run panel
``cli/panel.py`` and phase panel ``cli/live.py``) turns the events into a panel on a terminal or log
lines elsewhere. This module renders nothing and imports nothing of the display, so ``server/`` and
``campaign/`` stay free of rich. A listener that raises never breaks the work that reported: the
error is logged and dropped.

Phases (``Event.phase``) and what their ``info`` carries:

    ingest      rows (rows read so far), path (the data file)
    preflight   passed, rules, failures (at "end")
    launching   engine, pid, url (at "start"); line (the last engine log line that matters),
                waiting_on (the readiness check being waited on) (at "update"); seconds (at "end")
    generating  -
    stopping    step (the step now running), outcome (None while it runs) (at "update");
                verdict, seconds (at "end")
    trial       index, of, label (at "start"); step (its phase: reference, floor, probe, ...)

:class:`Phases` keeps the latest state of each phase from these events (which runs, since when, how
each ended): ``progress.json`` lists the active ones from it, and the command line's phase rows
(``cli/phases.py``) put words on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("harvest.events")

PHASES = ("ingest", "preflight", "launching", "generating", "stopping", "trial")
#: The order phases are listed in; ``trial`` (a sweep's trial k of n) comes first.
ORDER = ("trial", "ingest", "preflight", "launching", "connecting", "generating", "stopping")
#: Phases that follow one another: one starting ends the one before.
SEQUENTIAL = ("preflight", "launching", "connecting", "generating", "stopping")
Kind = Literal["start", "update", "end"]


@dataclass(frozen=True)
class Event:
    """One report of a phase: it started, something in it changed, or it ended."""

    phase: str
    kind: Kind
    info: Mapping[str, Any] = field(default_factory=dict)
    #: ``time.monotonic()`` when it was reported.
    at: float = field(default_factory=time.monotonic)
    #: False when an "end" reports a failure (the launch did not become ready, a dirty stop).
    ok: bool = True


Listener = Callable[[Event], None]


def emit(listener: Listener | None, phase: str, kind: Kind, *, ok: bool = True, **info: Any) -> None:
    """Report an event to ``listener`` (nothing when None); a listener's error is logged, not raised."""
    if listener is None:
        return
    try:
        listener(Event(phase, kind, info, ok=ok))
    except Exception as exc:  # noqa: BLE001 - a display must never end the work it shows
        log.debug("event listener failed on %s/%s: %s", phase, kind, exc)


@dataclass
class PhaseState:
    """One phase as its events left it: when it started and ended (monotonic), whether it ended
    well, and the ``info`` of its events merged (the latest value of each key)."""

    name: str
    started: float
    ended: float | None = None
    ok: bool = True
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.ended is None


class Phases:
    """The latest state of each phase, from events; thread-safe (fed from any thread, read by a
    display's refresh thread). A phase starting again restarts it (a relaunch's ``launching``); a
    :data:`SEQUENTIAL` phase starting ends the one before; a sweep's next ``trial`` starts every
    phase afresh. It keeps state only: it measures, renders and writes nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[str, PhaseState] = {}

    def on_event(self, event: Event) -> None:
        with self._lock:
            phase = self._phases.get(event.phase)
            if event.kind == "start":
                if event.phase == "trial":  # a sweep's next launch: its phases start afresh
                    self._phases.clear()
                if event.phase in SEQUENTIAL:
                    for other in self._phases.values():
                        if other.name in SEQUENTIAL and other.ended is None:
                            other.ended = event.at
                self._phases[event.phase] = PhaseState(event.phase, event.at, info=dict(event.info))
                return
            if phase is None:  # an update or end without a start: the phase began unseen
                phase = self._phases[event.phase] = PhaseState(event.phase, event.at)
            phase.info.update(event.info)
            if event.kind == "end":
                phase.ended = event.at
                phase.ok = event.ok

    def states(self) -> list[PhaseState]:
        """Copies of the phases seen, in :data:`ORDER` (then by start; unknown names last)."""
        with self._lock:
            phases = sorted(self._phases.values(), key=lambda p: (ORDER.index(p.name) if p.name in ORDER
                                                                   else len(ORDER), p.started))
            return [PhaseState(p.name, p.started, p.ended, p.ok, dict(p.info)) for p in phases]

    def active(self) -> list[str]:
        """The names of the phases running now, in :data:`ORDER`."""
        return [p.name for p in self.states() if p.active]

    def info(self, name: str) -> dict[str, Any]:
        with self._lock:
            phase = self._phases.get(name)
            return dict(phase.info) if phase is not None else {}


__all__ = ["Event", "Listener", "ORDER", "PHASES", "PhaseState", "Phases", "SEQUENTIAL", "emit"]
