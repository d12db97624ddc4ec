"""Readiness of a launching server: its checks passed in order, within a deadline, failing fast.

While waiting, the engine's log is read as it grows: a fatal line (out of memory, address in use,
NCCL, a traceback) or the process exiting ends the wait at once with a :class:`LaunchError`
carrying the log tail. The deadline is never extended and a timed-out wait is never retried here:
the caller moves on to cleanup and verification.

This module never spawns or signals processes; it only watches.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harvest.config import ServerConfig
from harvest.errors import LaunchError
from harvest.http import HttpError, SyncHttp
from harvest.redact import safe_line
from harvest.server.base import COMMON_FATAL, FatalPattern, ReadinessCheck, bearer_headers

#: Lines of log kept for error messages.
TAIL_LINES = 40
#: After a fatal line, how long to keep reading for the lines that name the cause.
FATAL_SETTLE_S = 1.0


class LogWatcher:
    """Reads a growing log file incrementally and keeps its last lines."""

    def __init__(self, path: Path, tail_lines: int = TAIL_LINES, secrets: Sequence[str] = (),
                 via: str | None = None):
        self.path = Path(path)
        #: What is opened to read it (a path through a held folder's descriptor), when not ``path``.
        self.via = via if via is not None else str(path)
        #: Values never shown in :meth:`tail` (the API key, secret [server.env] values).
        self.secrets = [s for s in secrets if s]
        self._offset = 0
        self._partial = ""
        self._tail: deque[str] = deque(maxlen=tail_lines)
        #: Everything read so far, capped (the KV-capacity line comes early in a log).
        self._head: list[str] = []
        self._head_chars = 0

    def read_new(self) -> str:
        """Complete lines appended since the last call (a trailing partial line waits)."""
        try:
            with open(self.via, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read(4 * 1024 * 1024)
        except FileNotFoundError:
            return ""
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        if "\n" in text:
            complete, _, self._partial = text.rpartition("\n")
            complete += "\n"
        else:
            complete, self._partial = "", text
        for line in complete.splitlines():
            self._tail.append(line)
        if self._head_chars < 2_000_000:
            self._head.append(complete)
            self._head_chars += len(complete)
        return complete

    def flush(self) -> str:
        """Read what is left, the partial last line included (the process has exited)."""
        text = self.read_new()
        if self._partial:
            self._tail.append(self._partial)
            text += self._partial
            self._head.append(self._partial)
            self._partial = ""
        return text

    def tail(self) -> str:
        """The last lines, fit to show: secrets redacted, control characters escaped."""
        return safe_line("\n".join(self._tail), self.secrets)

    def text(self) -> str:
        """The log read so far (up to about 2 MB from its start)."""
        return "".join(self._head)


@dataclass(frozen=True)
class Ready:
    """How readiness went."""

    seconds: float
    checks: tuple[str, ...]


#: The last line of a Python traceback: the exception's type and message, after an optional
#: ``(EngineCore_DP0 pid=12) `` prefix (vLLM's worker processes prefix every line they print).
_EXCEPTION_LINE = re.compile(r"^(?:\([^)\n]*\) )?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::\s.*|:)?)$")
_TRACEBACK = "Traceback (most recent call last):"


def exception_line(text: str, start: int) -> str | None:
    """The exception line that ends the traceback starting at ``text[start:]``, if it is there."""
    for line in text[start:].splitlines()[1:]:
        m = _EXCEPTION_LINE.match(line.rstrip())
        if m and not m.group(1).startswith(("Traceback", "During handling", "The above exception")):
            return m.group(1).strip()
    return None


def first_fatal(text: str, patterns: Sequence[FatalPattern]) -> tuple[FatalPattern, str] | None:
    """The first fatal pattern found in ``text`` and the line it matched.

    Engine-specific patterns are tried before the shared ones of ``COMMON_FATAL`` (whose
    ``^Traceback`` would otherwise win over the line that names the cause), in the order given.
    A match on a traceback's first line reports the traceback's last line instead: the exception.
    """
    ordered = sorted(patterns, key=lambda p: p in COMMON_FATAL)  # stable: the given order otherwise
    for pattern in ordered:
        m = pattern.search(text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            line = text[start:end if end >= 0 else len(text)].strip()
            if _TRACEBACK in line:
                line = exception_line(text, start) or line
            return pattern, line
    return None


def check_once(check: ReadinessCheck, config: ServerConfig, client: SyncHttp, timeout: float,
               port_listening: Callable[[str, int, float], bool]) -> bool:
    """One attempt of one check; any error means "not yet"."""
    if check.kind == "port":
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
        return port_listening(host, config.port, min(timeout, 0.5))
    url = check.url or f"{config.url}{check.path}"
    try:
        r = client.request(check.method, url, json=dict(check.json) if check.json is not None else None,
                           headers=bearer_headers(config), timeout=timeout)
        return r.ok
    except HttpError:
        return False


def wait_ready(
    *,
    config: ServerConfig,
    checks: Sequence[ReadinessCheck],
    fatal_patterns: Sequence[FatalPattern],
    log: LogWatcher | None,
    poll_exit: Callable[[], int | None],
    deadline_s: float,
    argv: Sequence[str] = (),
    cancelled: Callable[[], bool] = lambda: False,
    interval: float = 0.5,
    port_listening: Callable[[str, int, float], bool] | None = None,
    on_poll: Callable[[ReadinessCheck, str], None] | None = None,
) -> Ready:
    """Wait until every check passes, in order. Raises :class:`LaunchError` (with ``reason``) on
    process exit, a fatal log line, cancellation or the deadline. ``on_poll(check, new_log_text)``
    is told, once per poll, which check is waited on and what the log gained (for a display)."""
    if port_listening is None:
        from harvest.net import port_listening as _pl

        def port_listening(host: str, port: int, timeout: float) -> bool:
            return _pl(host, port, timeout=timeout)

    t0 = time.monotonic()
    end = t0 + deadline_s
    log_path = str(log.path) if log else None
    passed: list[str] = []

    def fail(message: str, reason: str, returncode: int | None = None) -> LaunchError:
        if log is not None:
            log.flush()
        return LaunchError(safe_line(message, log.secrets if log else ()), argv=argv, returncode=returncode,
                           log_path=log_path,
                           log_tail=log.tail() if log else "", reason=reason)

    with SyncHttp(max_connections=2) as client:
        while True:
            rc = poll_exit()
            if log is not None:
                new = log.flush() if rc is not None else log.read_new()
                hit = first_fatal(new, fatal_patterns)
                if hit is not None:
                    # The lines that name the cause often follow (a traceback ends with them): read
                    # on briefly, then report the most specific pattern found.
                    settle = time.monotonic() + FATAL_SETTLE_S
                    while rc is None and time.monotonic() < settle:
                        time.sleep(0.1)
                        rc = poll_exit()
                    new += log.flush() if rc is not None else log.read_new()
                    pattern, line = first_fatal(new, fatal_patterns) or hit
                    raise fail(f"{pattern.description} during start-up: {line}", pattern.reason, rc)
            if rc is not None:
                raise fail("the engine exited during start-up", "exited", rc)
            if cancelled():
                raise fail("start-up was cancelled", "cancelled")
            remaining = end - time.monotonic()
            check = checks[len(passed)]
            if on_poll is not None:
                on_poll(check, new if log is not None else "")
            if check_once(check, config, client, max(0.2, min(10.0, remaining)), port_listening):
                passed.append(check.name)
                if len(passed) == len(checks):
                    return Ready(time.monotonic() - t0, tuple(passed))
                continue
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise fail(f"not ready after {deadline_s:g} s (waiting for check {check.name!r})", "timeout")
            time.sleep(min(interval, remaining))


__all__ = ["LogWatcher", "Ready", "check_once", "exception_line", "first_fatal", "wait_ready"]
