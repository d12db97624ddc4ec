"""The seam between the client's policy and the HTTP library: one request in, one raw response out.

A base-layer leaf (aiohttp and yarl only, no harvest import): the client, the quality wire and the
sync helper :mod:`harvest.http` share it, each importing downward.

A transport sends one request and returns the status and body, or raises one of the exceptions
that say, by type, how the exchange failed: :class:`Unreachable` (no connection), :class:`Interrupted`
(connection lost after sending), :class:`TimedOut`, :class:`Oversized` (the answer passed its cap)
or :class:`Malformed` (what came back is not a valid HTTP message: a bad status line, too many or too
long headers, bad chunking, a duplicate Content-Length, an encoding that does not decode, or no HTTP
at all, such as an SSH server's banner). It never interprets a status, never logs, and never puts
request headers (the API key) or the URL into an exception. It retries one thing only, once: a
request the server closed its connection on without answering (``ServerDisconnectedError``, or a
``ClientOSError`` such as a broken pipe while the request was being written). That is the race of a
kept-alive connection the server closes just as the client reuses it (HTTP/1.1 allows it; seen at
128+ requests in flight on vLLM, where three at once made an endpoint "sick"),
and a second connection settles it; when the second try fails too, the first failure is raised, so
a server that died under a request still reads as :class:`Interrupted`, not :class:`Unreachable`.

What an answer may cost is bounded while it is read, before anything is kept: a body stops at its
``max_bytes`` counted after decompression (aiohttp >= 3.14.1 inflates a compressed body a bounded
piece at a time, as it is read: a 2 MB gzip body that inflates to 2 GB costs the cap, not 2 GB), an
error status's body is kept to its first :data:`ERROR_BODY_BYTES`, a stream stops at its
``max_bytes`` and at a line longer than ``max_line``, and each streamed ``data:`` payload is handed
to the caller's sink as it arrives (nothing of the stream is kept here); the sink may end the
stream early; past :data:`FREE_READ` an answer is read in one of :data:`BIG_READS` turns, and a
failure keeps nothing read. aiohttp's own bounds hold for the head (128 headers, 8190 bytes a line).

:class:`harvest.aiohttp_transport.AiohttpTransport` is the production transport:
one long-lived aiohttp connection pool per client with explicit connection limits and timeouts, never
an environment proxy. aiohttp is harvest's one HTTP library (the quality wire uses this transport too,
and :mod:`harvest.http` runs it for sync callers); it was chosen over httpx by measurement (P2,
``bench/client_cost.py``, raw loops of each): on loopback httpx 0.28 spent 4x (1 connection) to over
10x (64 connections) more CPU per request than aiohttp 3, x17 in the latest P2 run (BENCHMARKS.md).
:class:`MockTransport` answers from a function, for tests and for benchmarks without a server.
This module imports no HTTP library: what only a test's mock or a record needs stays light.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, Union

#: The cap of a body when the caller names none (a probe, a metrics scrape, the quality wire).
DEFAULT_MAX_BYTES = 64 << 20
#: What is kept of the body of an answer with a status other than 2xx: its first bytes, the rest
#: left unread (the status is the answer; the body only explains it).
ERROR_BODY_BYTES = 64 << 10
#: The caps of a stream when the caller names none (the canary of ``concurrency = "auto"``).
DEFAULT_STREAM_BYTES = 16 << 20
DEFAULT_MAX_LINE = 1 << 20
#: What an answer may hold while read without a turn (4,096 tokens are ~20 KB of JSON): past it, an
#: answer (or a streamed line) waits for one of BIG_READS turns: 1,024 huge ones cost a few caps.
#: One waiting still holds its connection's read: aiohttp's paused buffer and one socket read (~450 KiB).
FREE_READ = 64 << 10
BIG_READS = 8
#: How much of what a server sent an error message quotes.
_QUOTED_CHARS = 300


class TransportError(Exception):
    """Base of the ways an exchange can fail without an HTTP status."""


class Unreachable(TransportError):
    """No connection could be made: refused, connect timeout, name not resolved."""


class Interrupted(TransportError):
    """The connection broke after the request was sent: reset, closed early, truncated body."""

    def __init__(self, message: str, *, closed_unanswered: bool = False):
        super().__init__(message)
        #: The server closed the connection without a byte of answer (a kept-alive connection it
        #: hung up on, or a server that died): the one failure the transport tries once more.
        self.closed_unanswered = closed_unanswered


class TimedOut(Interrupted):
    """The whole exchange took longer than its timeout."""


class Oversized(TransportError):
    """The answer passed its cap (its body after decompression, a streamed line, the whole stream,
    or what the caller's sink allows): reading stopped there and the connection was closed."""


class Malformed(TransportError):
    """What came back is not a valid HTTP message (a bad status line, too many or too long headers,
    bad chunking, a duplicate Content-Length, an encoding that does not decode), or not HTTP at all.
    The message quotes what was sent, control characters escaped."""


@dataclass(frozen=True)
class RawResponse:
    """An HTTP answer as the transport received it."""

    status: int
    body: bytes
    #: The ``Retry-After`` header, verbatim, when the server sent one.
    retry_after: str | None = None
    #: The ``Location`` header of a 3xx, verbatim (never followed).
    location: str | None = None


@dataclass(frozen=True)
class TimedEvents:
    """A streamed answer (server-sent events) as the transport received it: when each event came."""

    status: int
    #: Seconds from sending the request to the arrival of each ``data:`` event that carries text.
    arrivals: tuple[float, ...]


#: Where a stream's ``data:`` payloads go as they arrive: ``sink(arrival_s, payload)``, seconds
#: after the request was sent; it returns False once it has had enough (reading stops there).
Sink = Callable[[float, bytes], bool]


@dataclass(frozen=True)
class StreamedResponse:
    """A streamed answer (``"stream": true``) as the transport received it: its payloads went to the
    sink. A status other than 200 carries the body instead (the error text), and no events."""

    status: int
    #: True when the sink ended the stream before the server did.
    cut: bool = False
    body: bytes = b""
    retry_after: str | None = None
    location: str | None = None


class Transport(Protocol):
    """What the client needs from an HTTP library. Lifecycle: create, ``request`` many times, ``aclose``."""

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> RawResponse:
        """Send one request; return the whole response (a 2xx body of ``max_bytes`` at most, after
        decompression, else :class:`Oversized`) or raise a :class:`TransportError`."""

    async def timed_events(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                           timeout: float, arrivals: list[float] | None = None) -> TimedEvents:
        """POST a streaming request; return when each of its events arrived (also appended to
        ``arrivals`` as they come), or raise a :class:`TransportError`. Never tried again."""

    async def stream(self, url: str, *, body: bytes, sink: Sink, headers: Mapping[str, str] | None = None,
                     timeout: float, max_bytes: int = DEFAULT_STREAM_BYTES,
                     max_line: int = DEFAULT_MAX_LINE) -> StreamedResponse:
        """POST a streaming request; hand each ``data:`` payload to ``sink`` as it arrives, or raise
        a :class:`TransportError`. Not tried again: the server may have started generating."""

    async def aclose(self) -> None:
        """Close every connection. Idempotent."""


class EventReader:
    """Server-sent events out of a byte stream, fed chunk by chunk: each ``data:`` payload (blank,
    ``[DONE]`` and other lines left out) goes to ``sink`` with its arrival. Raises
    :class:`Oversized` once the stream passes ``max_bytes`` or a line passes ``max_line``; keeps no
    more than the line being read."""

    __slots__ = ("_sink", "_started", "_max_bytes", "_max_line", "_rest", "_total")

    @property
    def held(self) -> int:
        """The bytes of the line being read."""
        return len(self._rest)

    def __init__(self, sink: Sink, started: float, max_bytes: int, max_line: int):
        self._sink, self._started = sink, started
        self._max_bytes, self._max_line = max_bytes, max_line
        self._rest = b""
        self._total = 0

    def feed(self, chunk: bytes) -> bool:
        """One chunk; False once the sink had enough."""
        self._total += len(chunk)
        if self._total > self._max_bytes:
            raise Oversized(f"the stream passed its cap of {self._max_bytes:,} bytes")
        buf = self._rest + chunk if self._rest else chunk
        at = time.monotonic() - self._started
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            if buf.startswith(b"data:", start) and not self._event(at, buf[start + 5:end]):
                self._rest = b""
                return False
            start = end + 1
        self._rest = buf[start:] if start else buf
        if len(self._rest) > self._max_line:
            self._rest = buf = chunk = b""  # kept by no traceback
            raise Oversized(f"a streamed line passed its cap of {self._max_line:,} bytes")
        return True

    def end(self) -> bool:
        """The stream ended: its last line, when it had no newline; False once the sink had enough."""
        rest, self._rest = self._rest, b""
        if rest.startswith(b"data:"):
            return self._event(time.monotonic() - self._started, rest[5:])
        return True

    def _event(self, at: float, payload: bytes) -> bool:
        payload = payload.strip()
        if not payload or payload == b"[DONE]":
            return True
        return self._sink(at, payload)


#: A server-sent event that carries generated text: a chat delta's content (or reasoning) or a
#: completion's text, not empty. A server may send a role-only chunk before any token (it would
#: read as a first token that never waited) and a usage-only one after the last.
_TEXT = re.compile(rb'"(?:content|reasoning_content|text)"\s*:\s*"[^"]')
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _carries_text(line: bytes) -> bool:
    return line.startswith(b"data:") and _TEXT.search(line) is not None


def _quoted(text: object) -> str:
    """What a server sent, as an error may quote it: one line, control characters escaped, cut."""
    shown = _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", " ".join(str(text).split()))
    return shown if len(shown) <= _QUOTED_CHARS else shown[:_QUOTED_CHARS] + "..."


#: A handler for :class:`MockTransport`: (method, url, body, headers) -> response, sync or async.
Handler = Callable[[str, str, Union[bytes, None], Mapping[str, str]],
                   Union[RawResponse, Awaitable[RawResponse]]]


class MockTransport:
    """A transport that answers every request by calling ``handler``, without a network.

    The handler may return a :class:`RawResponse` (or an awaitable of one) or raise a
    :class:`TransportError` to play a failing server. The request's ``timeout`` is enforced around an
    async handler, and its caps on what is read, as a real transport would.
    """

    def __init__(self, handler: Handler):
        self._handler = handler
        self.closed = False

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> RawResponse:
        raw = await self._answer(method, url, body, headers, timeout)
        if 200 <= raw.status < 300 and len(raw.body) > max_bytes:
            raise Oversized(f"the answer passed its cap of {max_bytes:,} bytes")
        return raw

    async def _answer(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None,
                      timeout: float) -> RawResponse:
        if self.closed:
            raise RuntimeError("transport is closed")
        result = self._handler(method, url, body, dict(headers or {}))
        if inspect.isawaitable(result):
            try:
                result = await asyncio.wait_for(result, timeout)
            except asyncio.TimeoutError:
                raise TimedOut(f"no complete response within {timeout:g} s") from None
        return result

    async def timed_events(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                           timeout: float, arrivals: list[float] | None = None) -> TimedEvents:
        """The handler's answer split into events, all arriving when it returned."""
        started = time.monotonic()
        raw = await self._answer("POST", url, body, headers, timeout)
        at = time.monotonic() - started
        events = [at for line in raw.body.splitlines() if _carries_text(line)]
        if arrivals is not None:
            arrivals.extend(events)
        return TimedEvents(raw.status, tuple(events))

    async def stream(self, url: str, *, body: bytes, sink: Sink, headers: Mapping[str, str] | None = None,
                     timeout: float, max_bytes: int = DEFAULT_STREAM_BYTES,
                     max_line: int = DEFAULT_MAX_LINE) -> StreamedResponse:
        """The handler's answer fed to ``sink`` as one chunk, every event arriving when it returned."""
        started = time.monotonic()
        raw = await self._answer("POST", url, body, headers, timeout)
        if raw.status != 200:
            return StreamedResponse(raw.status, False, raw.body[:ERROR_BODY_BYTES], raw.retry_after, raw.location)
        events = EventReader(sink, started, max_bytes, max_line)
        return StreamedResponse(raw.status, not (events.feed(raw.body) and events.end()))

    async def aclose(self) -> None:
        self.closed = True


__all__ = [
    "DEFAULT_MAX_BYTES",
    "ERROR_BODY_BYTES",
    "EventReader",
    "Handler",
    "Interrupted",
    "Malformed",
    "MockTransport",
    "Oversized",
    "RawResponse",
    "Sink",
    "StreamedResponse",
    "TimedEvents",
    "TimedOut",
    "Transport",
    "TransportError",
    "Unreachable",
]
