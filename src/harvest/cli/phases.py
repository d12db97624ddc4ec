"""The phases of a run (or a serve, a stop, a sweep) as the command line shows them: which is
running, for how long, and one line of what it is doing; as rows of a rich panel on a terminal, or
one plain line per change off it.

    board = PhaseBoard()
    server = Server(cfg, on_event=board.on_event)     # the supervisor reports through it
    for row in board.rows(): ...                      # PhaseRow(name, elapsed_s, active, ok, text)
    line = phase_line(board, event)                   # off a terminal: the line for this event, or None

The state of each phase is :class:`harvest.events.Phases` (fed by events from any thread); this
module puts words on it. It never measures or writes anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from harvest.events import Event, Phases
from harvest.redact import escape_controls, redact_text
from harvest.words import counted


@dataclass(frozen=True)
class PhaseRow:
    """One phase as shown: its name, seconds since it started (to its end once over), its line."""

    name: str
    elapsed_s: float
    active: bool
    ok: bool
    text: str


class PhaseBoard(Phases):
    """The latest state of each phase, from events, with a line of words for each. Thread-safe."""

    def rows(self, now: float | None = None) -> list[PhaseRow]:
        now = time.monotonic() if now is None else now
        rows = []
        for p in self.states():
            seconds = (p.ended if p.ended is not None else now) - p.started
            text = describe(p.name, {**p.info, "elapsed_s": seconds}, p.active, p.ok)
            # shown on a terminal: a URL's secrets hidden, an engine's or a file's controls escaped
            shown = escape_controls(redact_text(text), one_line=True)
            rows.append(PhaseRow(p.name, seconds, p.active, p.ok, shown))
        return rows


def phase_line(board: PhaseBoard, event: Event) -> str | None:
    """The plain line a display prints off a terminal once ``event`` is on ``board``: one per phase
    start or end, a launch's updates (its log line, what it waits on), and an endpoint that does not
    answer yet (what came back, at once and then every 10 s of the wait); None for other updates."""
    if event.kind == "update" and event.phase != "launching" and not _endpoint_wait_shown(event):
        return None
    row = next((r for r in board.rows() if r.name == event.phase), None)
    return None if row is None else f"[harvest] {row.name} ({row.elapsed_s:.1f} s): {row.text}"


def _endpoint_wait_shown(event: Event) -> bool:
    """A wait for an endpoint (``connecting``) is said at its first try and then every 10 s (the
    tries come about once a second): a refused connection is not a minute of silence."""
    waited = event.info.get("waited_s") if event.phase == "connecting" else None
    return isinstance(waited, (int, float)) and waited % 10.0 < 1.0


def phase_table(board: PhaseBoard) -> Table:
    """The phases, one row each: a mark (running / done / failed), name, elapsed, what it does."""
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(no_wrap=True, width=1)
    table.add_column(style="bold", no_wrap=True, width=10)
    table.add_column(justify="right", no_wrap=True, width=7)
    table.add_column(overflow="fold", ratio=1)  # what the phase does wraps, never cut
    for row in board.rows():
        mark = Text("▶", style="cyan") if row.active else (Text("✓", style="green") if row.ok
                                                            else Text("✗", style="bold red"))
        table.add_row(mark, row.name, elapsed(row.elapsed_s), Text(row.text, style="" if row.active else "dim"))
    return table


def elapsed(seconds: float) -> str:
    """``12.3 s`` under a minute, else ``4m05s`` (``1h02m`` past an hour)."""
    return f"{seconds:.1f} s" if seconds < 60 else duration(seconds)


def duration(seconds: float | None) -> str:
    """``4m05s``, ``1h02m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


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
        return "checking GPUs, host memory, swap, port, paths and disk"
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
    if info.get("malformed"):
        return f"not an HTTP answer from {', '.join(info['malformed'])}"
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
            "stopped": "stopped",
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


__all__ = ["PhaseBoard", "PhaseRow", "describe", "duration", "elapsed", "human_bytes", "phase_line",
           "phase_table"]
