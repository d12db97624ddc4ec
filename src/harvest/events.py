"""Phases of a long operation, reported to whoever watches: the seam between work and display.

    emit(on_event, "launching", "start", engine="vllm", pid=1234)

The runner, the supervisor, the stop and the sweep report what they are doing through an optional
listener (a plain callable taking an :class:`Event`); a display (``campaign/outputs/progress.py``,
``cli/live.py``) turns the events into a panel on a terminal or log lines elsewhere. This module
renders nothing and imports nothing of the display, so ``server/`` and ``campaign/`` stay free of
rich. A listener that raises never breaks the work that reported: the error is logged and dropped.

Phases (``Event.phase``) and what their ``info`` carries:

    ingest      rows (rows read so far), path (the data file)
    preflight   passed, rules, failures (at "end")
    launching   engine, pid, url (at "start"); line (the last engine log line that matters),
                waiting_on (the readiness check being waited on) (at "update"); seconds (at "end")
    generating  -
    stopping    step (the step now running), outcome (None while it runs) (at "update");
                verdict, seconds (at "end")
    trial       index, of, label (at "start"); step (its phase: reference, floor, probe, ...)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("harvest.events")

PHASES = ("ingest", "preflight", "launching", "generating", "stopping", "trial")
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


__all__ = ["Event", "Listener", "PHASES", "emit"]
