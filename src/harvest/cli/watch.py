"""``harvest status RUN_DIR --watch``: the live panel of a run going on in another process.

    harvest status runs/first-job --watch     # any terminal on the machine; Ctrl-C leaves the run alone

Read-only: the panel ``harvest run`` draws (``cli/panel.py``), redrawn from what the run writes,
never from the run itself: ``progress.json`` (its counts, rates, endpoints and phases, written every
``[run] progress_interval`` and, while nothing else writes it, every few seconds), ``runner.json``
(who runs it, and once the session ended how, with its exit code) and, for a detached run, the new
lines of ``run.log``, printed above the panel as the run's own terminal would show them (its
periodic progress lines left out: the panel says the same). It ends when the run's session ends:
exit 0 when the run finished (its exit code 0), 1 otherwise (the exit code said), or on Ctrl-C
(130) without touching the run. On a run that is not running it says so, shows the last state, and
exits as that session ended.

It reads files only: never the ledger's lock, never a write, never a signal.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

from harvest import safefiles
from harvest.campaign.outputs.progress import PROGRESS_FILE, ProgressView
from harvest.campaign.run import runner
from harvest.cli.live import PANEL_WIDTH
from harvest.cli.panel import run_panel
from harvest.cli.phases import PhaseBoard
from harvest.errors import UnsafePathError
from harvest.events import Event
from harvest.redact import escape_controls, redact_doc, redact_text

#: Seconds between two looks at the run's files (the panel is redrawn 4 times a second).
LOOK_S = 0.5
#: The run log's periodic progress lines (``[harvest] 12/300 items, ...``): the panel says the same.
PROGRESS_LINE = re.compile(r"^\[harvest\] \d[\d,]*/")


class _Watched:
    """What the watch knows of the run, refreshed from its files (see the module docstring)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.snap: dict[str, Any] | None = None
        self.before: dict[str, int] = {}
        self.board = PhaseBoard()
        self._mtime: float | None = None
        self._session: float | None = None

    def look(self) -> bool:
        """Read progress.json again when it changed; True when it did."""
        try:
            st = os.stat(self.run_dir / PROGRESS_FILE)
        except OSError:
            return False
        if st.st_mtime == self._mtime:
            return False
        try:
            snap = json.loads(safefiles.read_text(self.run_dir / PROGRESS_FILE))
        except (OSError, ValueError, UnsafePathError):
            return False  # written meanwhile, or not the run's: the next look reads it
        if not isinstance(snap, dict) or "total" not in snap:
            return False
        self._mtime = st.st_mtime
        self.snap = redact_doc(snap)
        before = snap.get("final_before_by_status")
        self.before = {k: v for k, v in before.items() if isinstance(v, int)} if isinstance(before, dict) else {}
        self.board = board_of(snap.get("phase_states") or [])
        return True

    def view(self) -> ProgressView | None:
        if self.snap is None:
            return None
        return ProgressView(self.run_dir, self.snap, self.before)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        view = self.view()
        if view is None:
            yield Text(f"waiting for {self.run_dir / PROGRESS_FILE} ...")
            return
        yield run_panel(view, self.board, min(options.max_width, PANEL_WIDTH))


def board_of(states: list[Any]) -> PhaseBoard:
    """The phase rows of progress.json's ``phase_states`` (epoch times, from another process)."""
    board = PhaseBoard()
    offset = time.monotonic() - time.time()
    for p in sorted((s for s in states if isinstance(s, dict)), key=lambda s: s.get("started_at") or 0):
        name, started = p.get("name"), p.get("started_at")
        if not isinstance(name, str) or not isinstance(started, (int, float)):
            continue
        found = p.get("info")
        info: dict[str, Any] = found if isinstance(found, dict) else {}
        board.on_event(Event(name, "start", info, at=started + offset))
        if isinstance(p.get("ended_at"), (int, float)):
            board.on_event(Event(name, "end", {}, at=p["ended_at"] + offset, ok=bool(p.get("ok", True))))
    return board


class _LogTail:
    """The new lines of a detached run's ``run.log``, from where the watch began."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.offset = os.stat(path).st_size
        except OSError:
            self.offset = 0

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self.offset:
                    self.offset = 0  # rotated: the new file from its start
                fh.seek(self.offset)
                data = fh.read(1 << 20)
        except OSError:
            return []
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        text = data[:cut].decode("utf-8", "replace").splitlines()
        return [escape_controls(redact_text(line)) for line in text if line and not PROGRESS_LINE.match(line)]


def watch(run_dir: Path, console: Console) -> int:
    """The watch of ``run_dir`` (see the module docstring); its exit code."""
    record = runner.read(run_dir)
    watched = _Watched(run_dir)
    watched.look()
    if record is None or record.ended_at is not None or not runner.alive(record):
        return _not_running(run_dir, record, watched, console)
    tail = _LogTail(run_dir / (record.log or runner.RUN_LOG)) if record.detached else None
    console.print(Text(f"watching the run in {run_dir} (runner pid {record.pid}); Ctrl-C stops watching, "
                       f"not the run", style="dim"))
    try:
        with Live(watched, console=console, refresh_per_second=4, transient=False) as live:
            while True:
                time.sleep(LOOK_S)
                for line in tail.lines() if tail is not None else ():
                    live.console.print(Text(line), soft_wrap=True)
                watched.look()
                now = runner.read(run_dir)
                if now is not None and now.pid == record.pid and now.ended_at is not None:
                    record = now
                    break
                if not runner.alive(record):
                    record = now if now is not None and now.pid == record.pid else record
                    break
            watched.look()
            live.refresh()
    except KeyboardInterrupt:
        console.print(Text(f"stopped watching; the run goes on (pid {record.pid}): "
                           f"`harvest stop {run_dir}` stops it"))
        return 130
    return _ended(record, console)


def _not_running(run_dir: Path, record: runner.RunnerRecord | None, watched: _Watched, console: Console) -> int:
    """A run that is not running: said, with its last state."""
    if record is None:
        console.print(Text(f"the run in {run_dir} is not running (no runner recorded); its last state:"))
    else:
        console.print(Text(f"the run in {run_dir} is not running; its last session (pid {record.pid}) "
                           + _how(record) + "; its last state:"))
    view = watched.view()
    if view is not None:
        console.print(run_panel(view, watched.board, min(console.width, PANEL_WIDTH)))
    else:
        console.print(Text("(no progress.json: `harvest status` reads the ledger)"))
    return 0 if record is not None and record.exit_code == 0 else 1


def _how(record: runner.RunnerRecord) -> str:
    if record.ended_at is None:
        return "ended without recording how (killed, or the machine restarted)"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.ended_at))
    note = f": {record.note}" if record.note and record.note != record.outcome else ""
    return f"ended {when}, {record.outcome}{note}, exit code {record.exit_code}"


def _ended(record: runner.RunnerRecord, console: Console) -> int:
    console.print(Text(f"the run's session (pid {record.pid}) {_how(record)}"))
    return 0 if record.exit_code == 0 else 1


__all__ = ["board_of", "watch"]
