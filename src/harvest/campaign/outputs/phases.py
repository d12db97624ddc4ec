"""The phases of a run (or a serve, a stop, a sweep) as a display shows them: which is running,
for how long, and one line of what it is doing.

    board = PhaseBoard()
    server = Server(cfg, on_event=board.on_event)     # the supervisor reports through it
    for row in board.rows(): ...                      # PhaseRow(name, elapsed_s, active, ok, text)

Fed by :class:`harvest.events.Event` from any thread; read by the display's refresh thread. It
keeps only the latest state of each phase (a relaunch restarts ``launching``), formats text, and
never measures, renders or writes anything.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harvest.events import Event
from harvest.redact import escape_controls, redact_text
from harvest.words import counted

#: Display order; ``trial`` (a sweep's trial k of n) comes first.
ORDER = ("trial", "ingest", "preflight", "launching", "connecting", "generating", "stopping")
#: Phases that follow one another: one starting ends the one before.
SEQUENTIAL = ("preflight", "launching", "connecting", "generating", "stopping")


@dataclass
class _Phase:
    name: str
    started: float
    ended: float | None = None
    ok: bool = True
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PhaseRow:
    """One phase as shown: its name, seconds since it started (to its end once over), its line."""

    name: str
    elapsed_s: float
    active: bool
    ok: bool
    text: str


class PhaseBoard:
    """The latest state of each phase, from events. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[str, _Phase] = {}

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
                self._phases[event.phase] = _Phase(event.phase, event.at, info=dict(event.info))
                return
            if phase is None:  # an update or end without a start: the phase began unseen
                phase = self._phases[event.phase] = _Phase(event.phase, event.at)
            phase.info.update(event.info)
            if event.kind == "end":
                phase.ended = event.at
                phase.ok = event.ok

    def active(self) -> list[str]:
        with self._lock:
            return [p.name for p in self._phases.values() if p.ended is None]

    def info(self, name: str) -> dict[str, Any]:
        with self._lock:
            phase = self._phases.get(name)
            return dict(phase.info) if phase is not None else {}

    def rows(self, now: float | None = None) -> list[PhaseRow]:
        now = time.monotonic() if now is None else now
        with self._lock:
            phases = sorted(self._phases.values(), key=lambda p: (ORDER.index(p.name) if p.name in ORDER
                                                                   else len(ORDER), p.started))
            rows = []
            for p in phases:
                elapsed = (p.ended if p.ended is not None else now) - p.started
                text = describe(p.name, {**p.info, "elapsed_s": elapsed}, p.ended is None, p.ok)
                # shown on a terminal: a URL's secrets hidden, an engine's or a file's controls escaped
                rows.append(PhaseRow(p.name, elapsed, p.ended is None, p.ok,
                                     escape_controls(redact_text(text), one_line=True)))
            return rows


def describe(name: str, info: dict[str, Any], active: bool, ok: bool) -> str:
    """One line saying what a phase is doing (or how it ended)."""
    fn = _DESCRIBE.get(name)
    if fn is not None:
        return fn(info, active, ok)
    return ", ".join(f"{k} {v}" for k, v in info.items() if k != "elapsed_s")


def _ingest(info: dict[str, Any], active: bool, ok: bool) -> str:
    rows = info.get("rows")
    text = f"{counted(rows, 'row')} read" if isinstance(rows, int) else "reading"
    size, pos = info.get("size"), info.get("position")
    if isinstance(size, int) and size > 0:
        if active and isinstance(pos, int):
            text += f", {min(pos / size, 1.0):.0%} of {human_bytes(size)}"
        else:
            text += f" of {human_bytes(size)}"
    if not active:
        text += ", complete" if ok else ", stopped (resumes next time)"
    return text


def _preflight(info: dict[str, Any], active: bool, ok: bool) -> str:
    if active:
        return "checking GPUs, host memory, swap, port and disk"
    rules, failures = info.get("rules"), info.get("failures") or 0
    if info.get("passed"):
        return f"PASS ({rules} rules)"
    forced = "; launching anyway (--force)" if info.get("forced") else ""
    return f"FAIL ({failures} of {rules} rules){forced}"


def _relaunch(info: dict[str, Any]) -> str:
    """``relaunch 1 of 3`` when the phase belongs to a relaunch, else ""."""
    return f"relaunch {info['relaunch']} of {info.get('of', '?')}" if info.get("relaunch") else ""


def _launching(info: dict[str, Any], active: bool, ok: bool) -> str:
    # a far or Ray launch names its place; a local one its pid
    where = f"on {info['where']}" if info.get("where") else f"pid {info.get('pid', '?')}"
    who = f"{info.get('engine', 'engine')} {where}"
    if _relaunch(info):
        who = f"{_relaunch(info)}: {who}"
    if not active:
        if not ok:
            return f"{who}: did not become ready ({info.get('reason', 'failed')})"
        kv = info.get("kv_capacity_tokens")
        return f"{who} ready in {info.get('seconds', 0):.1f} s" + (f", KV cache {kv:,} tokens" if kv else "")
    parts = [f"{who}, {info.get('elapsed_s', 0):.0f} s since spawn"]
    if info.get("waiting_on"):
        parts.append(f"waiting on {info['waiting_on']}")
    if info.get("line"):
        parts.append(f"log: {info['line']}")
    return " · ".join(parts)


def _connecting(info: dict[str, Any], active: bool, ok: bool) -> str:
    if active:
        deadline = info.get("deadline_s")
        waited = info.get("waited_s")
        text = "asking /v1/models"
        if info.get("url"):
            text += f" of {info['url']}: {info['got'] if info.get('got') else 'no answer yet'}"
        if isinstance(waited, (int, float)) and isinstance(deadline, (int, float)):
            text += f", {waited:.0f} s of the {deadline:g} s start_deadline"
        return text
    if info.get("silent"):
        return f"no answer from {', '.join(info['silent'])} within the start_deadline"
    if info.get("refused"):
        return f"model {info['refused']!r} is not served there"
    if info.get("warning"):
        # the endpoint is up but could not list its models: say what came back, and what is asked
        return str(info["warning"])
    return f"model {info['model']!r} served" if info.get("model") else "answered"


def _generating(info: dict[str, Any], active: bool, ok: bool) -> str:
    if active:
        return f"sending requests again after {_relaunch(info)} ({info['why']})" if _relaunch(info) \
            else "sending requests"
    outcome = info.get("outcome")
    if outcome == "relaunching":
        return f"paused for {_relaunch(info)}: {info.get('why')}"
    if outcome is None:  # ended by the next phase, not by the run: the run goes on
        return "paused"
    text = {"finished": "finished: nothing left to send",
            "interrupted": "stopped: interrupted (run again to resume)",
            "stopped": "stopped by the circuit breaker",
            "server_down": "stopped: the server is down"}.get(str(outcome), f"ended: {outcome}")
    if info.get("note") and outcome != "interrupted":
        text += f" ({info['note']})"
    return text


def _stopping(info: dict[str, Any], active: bool, ok: bool) -> str:
    if not active:
        verdict = str(info.get("verdict", "?")).upper()
        done = f"verified stop: {verdict} in {info.get('seconds', 0):.2f} s"
        return f"{done}, before {_relaunch(info)}" if _relaunch(info) else done
    step, outcome = info.get("step"), info.get("outcome")
    if step is None:
        return "starting the verified stop"
    return f"step {step}" + (f" done: {outcome}" if outcome else " ...")


def _trial(info: dict[str, Any], active: bool, ok: bool) -> str:
    text = f"trial {info.get('index', '?')} of {info.get('of', '?')}"
    if info.get("label"):
        text += f" ({info['label']})"
    if info.get("step"):
        text += f": {info['step']}"
    return text


_DESCRIBE = {"ingest": _ingest, "preflight": _preflight, "launching": _launching, "connecting": _connecting,
             "generating": _generating,
             "stopping": _stopping, "trial": _trial}


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


__all__ = ["ORDER", "PhaseBoard", "PhaseRow", "SEQUENTIAL", "describe", "human_bytes"]
