"""The live display of the commands a person watches: one console, log lines above the panel.

    console = live_console()
    setup_console_logging(console)                   # log records print through it
    with PhaseDisplay(console, "harvest serve") as display:
        server = Server(cfg, on_event=display.on_event)
        server.launch()

On a terminal, a rich Live panel shows the phases (``harvest.events``) with their elapsed time,
redrawn a few times a second; everything else (log records, preflight rules, stop steps) is
printed through the same console, so it lands above the panel and never inside it. Off a
terminal, one plain line per phase change (``cli/phases.py``'s :func:`phase_line`). ``harvest run``
draws its own panel (``cli/panel.py``, a :class:`PhaseDisplay` with the run's figures below its
phases) on the console made here. This module only renders.
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from harvest.cli.phases import PhaseBoard, phase_line, phase_table
from harvest.cli.text import as_text
from harvest.events import Event
from harvest.redact import escape_controls, redact_text

#: Redraws a second of a live panel (elapsed times tick even when nothing is reported).
REFRESH_PER_SECOND = 4
#: Widest a live panel is drawn (narrower terminals get their width): a fixed frame, not one
#: that jumps with the length of its longest line.
PANEL_WIDTH = 120


def live_console() -> Console:
    """The one stderr console of a command: never wraps long lines, no highlighting."""
    return Console(file=sys.stderr, soft_wrap=True, highlight=False)


class ConsoleLogHandler(logging.Handler):
    """Log records printed through a console, so a live panel on it stays whole (they go above)."""

    def __init__(self, console: Console, level: int = logging.NOTSET):
        super().__init__(level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            style = "yellow" if record.levelno >= logging.WARNING else ""
            # on a terminal wrapped between words (the terminal would cut a word in two), else one line
            self.console.print(Text(message, style=style), soft_wrap=not self.console.is_terminal)
        except Exception:  # noqa: BLE001 - logging's own policy: report through handleError
            self.handleError(record)


class ShownFilter(logging.Filter):
    """Log records as the console may show them: secrets by shape (a URL's user part, a query key,
    a Bearer token) hidden and control characters escaped, whatever the message quotes."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = escape_controls(redact_text(record.getMessage()))
        record.args = None
        if record.exc_info:  # a traceback logged with the record: the same, as text
            record.exc_text = escape_controls(redact_text(logging.Formatter().formatException(record.exc_info)))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = escape_controls(redact_text(record.stack_info))
        return True


def setup_console_logging(console: Console) -> None:
    """Route the root logger to ``console`` (INFO, message only), replacing stream handlers."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, (logging.StreamHandler, ConsoleLogHandler)) and \
                not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    handler = ConsoleLogHandler(console)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(ShownFilter())
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


def quiet_keyboard() -> Any:
    """Stop the terminal from echoing what is typed (``^C`` included) while a live panel is drawn:
    an echo moves the cursor under the panel, which then leaves a stray copy of its top border
    behind at its next redraw. Returns what :func:`restore_keyboard` gives back (None: stdin is no
    terminal, nothing changed)."""
    try:
        import termios

        fd = sys.stdin.fileno()
        if not os.isatty(fd):
            return None
        saved = termios.tcgetattr(fd)
        quiet = list(saved)
        quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)  # lflags
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
        return fd, saved
    except (ImportError, OSError, ValueError, AttributeError):  # no termios, no stdin, a closed one
        return None


def restore_keyboard(saved: Any) -> None:
    """The terminal's echo as it was before :func:`quiet_keyboard`."""
    if saved is None:
        return
    try:
        import termios

        termios.tcsetattr(saved[0], termios.TCSANOW, saved[1])
    except (ImportError, OSError, ValueError):
        pass


class PhaseDisplay:
    """A panel of phases for ``harvest serve`` / ``harvest stop`` (and lines off a terminal).

    :meth:`on_event` is the listener to hand to the supervisor or the stop; it may be called from
    any thread. :meth:`print` prints above the panel.
    """

    def __init__(self, console: Console, title: str, *, live: bool | None = None, phase_lines: bool = True):
        self.console = console
        self.phase_lines = phase_lines
        self.title = title
        self.board = PhaseBoard()
        self.live_enabled = console.is_terminal if live is None else live
        self._live: Live | None = None
        self._echo: Any = None

    def on_event(self, event: Event) -> None:
        self.board.on_event(event)
        if self.phase_lines and not self.live_enabled and (line := phase_line(self.board, event)) is not None:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        self.console.print(*objects, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Panel(phase_table(self.board), title=as_text(self.title), title_align="left",
                    width=min(options.max_width, PANEL_WIDTH))

    def __enter__(self) -> PhaseDisplay:
        if self.live_enabled:
            self._echo = quiet_keyboard()
            self._live = Live(self, console=self.console, refresh_per_second=REFRESH_PER_SECOND)
            self._live.__enter__()
        return self

    def refresh(self) -> None:
        """Redraw the panel now (nothing off a terminal or once closed)."""
        if self._live is not None:
            self._live.refresh()

    def close(self) -> None:
        """Stop redrawing; the panel's last state stays on the screen."""
        if self._live is not None:
            live, self._live = self._live, None
            try:
                live.__exit__(None, None, None)
            finally:
                restore_keyboard(self._echo)
                self._echo = None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


__all__ = ["ConsoleLogHandler", "PANEL_WIDTH", "PhaseDisplay", "REFRESH_PER_SECOND", "ShownFilter", "live_console",
           "setup_console_logging"]
