"""A real terminal for the display tests: a tmux server on a socket the test owns, one pane running
the command, and captures of the screen as text (kept as files, the test's artifacts).

The tmux server is started here and stopped here, by its pid (checked with its create time);
the default tmux socket and any other tmux server are never touched.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.realparts import require

#: Columns and rows of the test terminal (what a person's terminal commonly has).
WIDTH, HEIGHT = 130, 45
#: What the pane's shell prints after the command, with its exit status and "]".
EXIT_MARK = "[command exited"


def tmux_binary() -> str:
    require("tmux", "the display tests need a real terminal")
    return str(shutil.which("tmux"))


@dataclass
class Screen:
    """One capture of the visible screen."""

    at: float
    text: str

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    def frames(self) -> list[tuple[int, int]]:
        """(top, bottom) line indexes of every panel frame (a ╭ line down to its ╰ line)."""
        out, top = [], None
        for i, line in enumerate(self.lines):
            if line.startswith("╭"):
                top = i
            elif line.startswith("╰") and top is not None:
                out.append((top, i))
                top = None
        return out

    def inside(self, index: int = -1) -> list[str]:
        """The lines inside a frame (the last one by default), without its borders."""
        frames = self.frames()
        if not frames:
            return []
        top, bottom = frames[index]
        return self.lines[top + 1:bottom]

    def above(self, index: int = -1) -> list[str]:
        """The lines above a frame (the last one by default)."""
        frames = self.frames()
        return self.lines[:frames[index][0]] if frames else self.lines

    def phase(self, name: str) -> tuple[str, float] | None:
        """(mark, elapsed seconds) of a phase row in the frame, or None when it is not there."""
        for line in self.inside():
            m = re.match(rf"│\s*(\S)\s+{name}\s+(\d+(?:\.\d+)?) s\b", line)
            if m:
                return m.group(1), float(m.group(2))
            m = re.match(rf"│\s*(\S)\s+{name}\s+(\d+)m(\d\d)s\b", line)
            if m:
                return m.group(1), 60 * int(m.group(2)) + int(m.group(3))
        return None


@dataclass
class Terminal:
    """A tmux server on its own socket with one pane running ``command``."""

    folder: Path
    tmux: str = field(default_factory=tmux_binary)
    screens: list[Screen] = field(default_factory=list)
    pid: int | None = None
    create_time: float | None = None
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def socket(self) -> Path:
        return self.folder / "tmux.sock"

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run([self.tmux, "-S", str(self.socket), *args], capture_output=True, text=True,
                              timeout=15, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def start(self, argv: list[str], *, env: dict[str, str], cwd: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        conf = self.folder / "tmux.conf"
        # The pane stays after the command exits, so its last screen and exit status can be read.
        conf.write_text("set -g remain-on-exit on\nset -g status off\nset -g history-limit 10000\n")
        # The shell reports the exit status on the screen (tmux can be slow to reap the pane's
        # process); its INT trap lets Ctrl-C reach the command alone, which then ends as it chooses.
        command = f"trap true INT; cd {shlex.quote(str(cwd))} && {shlex.join(argv)}; echo \"{EXIT_MARK} $?]\""
        # The pane's own size is the terminal's: COLUMNS / LINES of the test process (pytest-xdist's
        # workers have 80 x 24) would tell the command another width than the one it draws in.
        shown = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
        self._tmux("-f", str(conf), "new-session", "-d", "-s", "harvest", "-x", str(self.width), "-y", str(self.height),
                   command, env={**shown, "TERM": "xterm-256color"})
        self.pid = int(self._tmux("display-message", "-p", "#{pid}").strip())
        self.create_time = psutil.Process(self.pid).create_time()

    def capture(self) -> Screen:
        # -J: a line the terminal wrapped comes back whole (a long path stays one line).
        raw = self._tmux("capture-pane", "-p", "-J", "-t", "harvest")
        screen = Screen(time.monotonic(), "\n".join(line.rstrip() for line in raw.splitlines()).rstrip("\n"))
        if not self.screens or self.screens[-1].text != screen.text:
            self.screens.append(screen)
            (self.folder / f"screen-{len(self.screens):03d}.txt").write_text(screen.text + "\n")
        return screen

    def exit_status(self) -> int | None:
        """The command's exit status once it has exited, else None."""
        text = self.screens[-1].text if self.screens else ""
        found = re.search(rf"^{re.escape(EXIT_MARK)} (\d+)\]$", text, re.M)
        if found:
            return int(found.group(1))
        fields = self._tmux("display-message", "-p", "-t", "harvest", "#{pane_dead} #{pane_dead_status}").split()
        return int(fields[1]) if fields and fields[0] == "1" and len(fields) > 1 else None

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "harvest", *keys)

    def stop(self) -> None:
        """Stop the tmux server this terminal started, by its pid (and create time)."""
        if self.pid is None:
            return
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - (self.create_time or 0)) > 0.05:
                return  # the pid was reused: not ours
            os.kill(self.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
        finally:
            self.pid = None


__all__ = ["HEIGHT", "Screen", "Terminal", "WIDTH", "tmux_binary"]
