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
``max_bytes`` counted after decompression (aiohttp >= 3.13.3 inflates a compressed body a bounded
piece at a time, as it is read: a 2 MB gzip body that inflates to 2 GB costs the cap, not 2 GB), an
error status's body is kept to its first :data:`ERROR_BODY_BYTES`, a stream stops at its
``max_bytes`` and at a line longer than ``max_line``, and each streamed ``data:`` payload is handed
to the caller's sink as it arrives (nothing of the stream is kept here); the sink may end the
stream early; past :data:`FREE_READ` an answer is read in one of :data:`BIG_READS` turns, and a
failure keeps nothing read. aiohttp's own bounds hold for the head (128 headers, 8190 bytes a line).

:class:`AiohttpTransport` is the production transport: one long-lived ``aiohttp.ClientSession`` per
client with explicit connection limits and timeouts, never an environment proxy. aiohttp is harvest's one
HTTP library (the quality wire uses this transport too, and :mod:`harvest.http` runs it for sync
callers); it was chosen over httpx by measurement (P2, ``bench/client_cost.py``, raw loops of each): on
loopback httpx 0.28 spent 4x (1 connection) to over 10x (64 connections) more CPU per request than
aiohttp 3, x17 in the latest P2 run (BENCHMARKS.md).
:class:`MockTransport` answers from a function, for tests and for benchmarks without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Union  # Any: aiohttp's protocol object

import aiohttp
from aiohttp.http_exceptions import ContentLengthError, HttpProcessingError
from yarl import URL

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


class _LostBodies:
    """Wakes a body's reader whose connection was lost before the body ended without aiohttp
    telling the reader: its C parser, given a body that breaks HTTP's framing mid-way (a chunk size
    that is not hexadecimal), closes the connection and leaves the reader waiting until the
    request's timeout (aiohttp 3.14). Only bodies read in several pieces are watched; one callback
    per connection, on aiohttp's own "closed" future (its outcome retrieved here)."""

    def __init__(self) -> None:
        self._reading: dict[int, aiohttp.StreamReader] = {}
        self._watched: set[int] = set()

    def watch(self, resp: aiohttp.ClientResponse) -> int | None:
        """Watch ``resp``'s body while it is read; the key to :meth:`done`, or None."""
        connection = resp.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is None:
            return None
        key = id(protocol)
        if key not in self._watched:
            closed = protocol.closed
            if closed is None:  # already lost: aiohttp has told the reader
                return None
            self._watched.add(key)
            closed.add_done_callback(lambda f: self._lost(key, protocol, f))
        self._reading[key] = resp.content
        return key

    def done(self, key: int | None) -> None:
        if key is not None:
            self._reading.pop(key, None)

    def _lost(self, key: int, protocol: Any, closed: asyncio.Future[None]) -> None:
        if not closed.cancelled():
            closed.exception()  # retrieved: a connection lost with an error is not news here
        self._watched.discard(key)
        content = self._reading.pop(key, None)
        if content is None or content.is_eof() or content.exception() is not None:
            return
        why = protocol.exception()
        said = _quoted(why.message) if isinstance(why, HttpProcessingError) else "the connection closed mid-body"
        content.set_exception(Malformed(f"not a valid HTTP answer: {said}"))


class AiohttpTransport:
    """One ``aiohttp.ClientSession`` with a bounded connection pool, created on first use."""

    def __init__(self, *, max_connections: int, connect_timeout: float = 10.0,
                 keepalive_timeout: float = 2.0):
        # keepalive_timeout stays well below uvicorn's 5 s (vLLM, SGLang): an idle connection is
        # dropped here before the server closes it. The margin is wide because the client's clock
        # starts when it has read the answer, the server's when it sent it: a loaded client reads late.
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._max_connections = max_connections
        self._connect_timeout = connect_timeout
        self._keepalive_timeout = keepalive_timeout
        self._session: aiohttp.ClientSession | None = None
        #: Connections used once (``force_close``): where a request the server hung up on is tried again.
        self._fresh: aiohttp.ClientSession | None = None
        self._closed = False
        # Parsing a URL and building a timeout object cost more than the rest of the request path;
        # the client uses a handful of each, so they are built once.
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._lost = _LostBodies()
        self._turns: asyncio.Semaphore | None = None  # made with the session, on its loop


    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("transport is closed")
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         keepalive_timeout=self._keepalive_timeout, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                              raise_for_status=False, trust_env=False)
        self._turns = asyncio.Semaphore(BIG_READS)
        return self._session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=min(self._connect_timeout, seconds))
            if len(self._timeouts) < 32:  # a retry's leftover seconds are one-off values
                self._timeouts[seconds] = timeout
        return timeout

    def _url(self, url: str) -> URL:
        target = self._urls.get(url)
        if target is None:
            target = URL(url)
            if len(self._urls) < 256:
                self._urls[url] = target
        return target

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> RawResponse:
        session = self._session or self._open()
        target = self._url(url)
        started = time.monotonic()
        try:
            return await self._send(session, method, target, body, headers, timeout, max_bytes)
        except Interrupted as exc:
            if not exc.closed_unanswered:
                raise
            first = exc
        left = timeout - (time.monotonic() - started)
        if left <= 0 or self._closed:  # closed meanwhile (the client ending): no new session to leak
            raise first
        if self._fresh is None:
            # Another pooled connection may be as stale as the first (a client that read its answers
            # late, on a loaded machine, reuses all of them late): a new connection, used once.
            self._fresh = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, force_close=True),
                auto_decompress=True, raise_for_status=False, trust_env=False)
        try:  # once more, on a new connection
            return await self._send(self._fresh, method, target, body, headers, left, max_bytes)
        except TransportError:
            raise first from None

    async def _send(self, session: aiohttp.ClientSession, method: str, target: URL, body: bytes | None,
                    headers: Mapping[str, str] | None, timeout: float, max_bytes: int) -> RawResponse:
        with _failures(timeout):
            async with session.request(method, target, data=body, headers=headers,
                                       timeout=self._timeout(timeout), allow_redirects=False) as resp:
                status = resp.status
                if 200 <= status < 300:
                    return RawResponse(status, await _read_body(resp, max_bytes, self._lost, turns=self._turns))
                data = await _read_body(resp, min(max_bytes, ERROR_BODY_BYTES), self._lost, keep_first=True)
                return RawResponse(status, data, *_extra_headers(resp))

    async def timed_events(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                           timeout: float, arrivals: list[float] | None = None) -> TimedEvents:
        arrivals = [] if arrivals is None else arrivals

        def sink(at: float, payload: bytes) -> bool:
            if _TEXT.search(payload) is not None:
                arrivals.append(at)
            return True

        answer = await self.stream(url, body=body, sink=sink, headers=headers, timeout=timeout)
        return TimedEvents(answer.status, tuple(arrivals) if answer.status == 200 else ())

    async def stream(self, url: str, *, body: bytes, sink: Sink, headers: Mapping[str, str] | None = None,
                     timeout: float, max_bytes: int = DEFAULT_STREAM_BYTES,
                     max_line: int = DEFAULT_MAX_LINE) -> StreamedResponse:
        session = self._session or self._open()
        started = time.monotonic()
        with _failures(timeout):
            async with session.post(self._url(url), data=body, headers=headers, timeout=self._timeout(timeout),
                                    allow_redirects=False) as resp:
                if resp.status != 200:
                    data = await _read_body(resp, min(max_bytes, ERROR_BODY_BYTES), self._lost, keep_first=True)
                    return StreamedResponse(resp.status, False, data, *_extra_headers(resp))
                events = EventReader(sink, started, max_bytes, max_line)
                content = resp.content
                watch, turn = self._lost.watch(resp), _Turn(self._turns)
                try:
                    while await turn.fits(events.held) and (chunk := await content.readany()):
                        if not events.feed(chunk):
                            resp.close()  # the sink had enough: the rest of the stream is not read
                            return StreamedResponse(resp.status, True)
                finally:
                    self._lost.done(watch)
                    turn.end()
                return StreamedResponse(resp.status, not events.end())

    async def aclose(self) -> None:
        self._closed = True
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None


class _Turn:
    """An answer's turn among BIG_READS: held while what it holds is past FREE_READ, or until it ends."""

    __slots__ = ("_turns", "_held")

    def __init__(self, turns: asyncio.Semaphore | None):
        self._turns, self._held = turns, False

    async def fits(self, holding: int) -> bool:
        """True once holding ``holding`` bytes may read on (waits for a turn past FREE_READ)."""
        if self._turns is not None and (holding > FREE_READ) != self._held:
            if self._held:
                self._turns.release()
            else:
                await self._turns.acquire()
            self._held = not self._held
        return True

    def end(self) -> None:
        if self._held and self._turns is not None:
            self._turns.release()
        self._held = False


async def _read_body(resp: aiohttp.ClientResponse, cap: int, lost: _LostBodies, *, keep_first: bool = False,
                     turns: asyncio.Semaphore | None = None) -> bytes:
    """The body of ``resp``, decompressed, at most ``cap`` bytes: :class:`Oversized` past it (or,
    with ``keep_first``, its first ``cap`` bytes, the rest left unread). Past :data:`FREE_READ`, read
    in one of ``turns``."""
    declared = resp.content_length
    if declared is not None and declared > cap and not keep_first and "Content-Encoding" not in resp.headers:
        resp.close()
        raise Oversized(f"the answer announced {declared:,} bytes, over its cap of {cap:,} bytes")
    content = resp.content
    first = await content.readany()  # an answer of one read (most): no copy
    if not first or (len(first) <= cap and content.at_eof()):
        return first
    parts, size = [first], len(first)
    watch, turn = lost.watch(resp), _Turn(turns)
    try:
        while size <= cap and await turn.fits(size) and (chunk := await content.readany()):
            parts.append(chunk)
            size += len(chunk)
    finally:
        lost.done(watch)
        turn.end()
    if size > cap:
        resp.close()  # the rest is never read: this connection is not used again
        if not keep_first:
            parts, first, chunk = [], b"", b""  # the exception's traceback holds this frame: not what was read
            raise Oversized(f"the answer passed its cap of {cap:,} bytes"
                            f"{' (decompressed)' if 'Content-Encoding' in resp.headers else ''}")
        return b"".join(parts)[:cap]
    return b"".join(parts)


def _extra_headers(resp: aiohttp.ClientResponse) -> tuple[str | None, str | None]:
    """``(Retry-After, Location)`` of a failed answer: the first for 4xx/5xx, the second for 3xx."""
    status = resp.status
    return (resp.headers.get("Retry-After") if status >= 400 else None,
            resp.headers.get("Location") if 300 <= status < 400 else None)


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


@contextlib.contextmanager
def _failures(timeout: float) -> Iterator[None]:
    """aiohttp's exceptions as the ones of this module."""
    try:
        yield
    # Order matters: a connect timeout is also a TimeoutError, a refused connection an OSError.
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise Unreachable(_describe(exc)) from None
    except (asyncio.TimeoutError, TimeoutError):
        raise TimedOut(f"no complete response within {timeout:g} s") from None
    except aiohttp.ServerDisconnectedError as exc:
        raise Interrupted(_describe(exc), closed_unanswered=True) from None
    except aiohttp.ClientOSError as exc:
        # The same race met while the request is still being written: the server closed the kept-alive
        # connection, and the write fails ("Broken pipe", or "Can not write request body" once the
        # loop has seen the close). Seen with vLLM CPU on 2 cores, whose client, starved of CPU for
        # seconds, reused connections the server had closed: three in a row made the endpoint "sick".
        # A reset met while waiting for the answer lands here too: no answer came either way, and the
        # one more try is the same as a hang-up's (a dead server refuses it and the first failure is
        # raised).
        raise Interrupted(_describe(exc), closed_unanswered=True) from None
    except aiohttp.ClientPayloadError as exc:
        # A body cut short is a broken connection (the server went away: aiohttp names it "not
        # completed", whatever the framing); a body that breaks HTTP's own rules (bad chunking, an
        # encoding that does not decode) is not: it fails the same way every time.
        cause = exc.__cause__
        if (isinstance(cause, HttpProcessingError) and not isinstance(cause, ContentLengthError)
                and not str(exc).startswith("Response payload is not completed")):
            raise Malformed(f"not a valid HTTP answer: {_quoted(cause.message)}") from None
        raise Interrupted(_describe(exc)) from None
    except aiohttp.ClientConnectionError as exc:
        raise Interrupted(_describe(exc)) from None
    except aiohttp.ClientResponseError as exc:  # its text names the URL and the request's headers: not kept
        raise Malformed(f"not a valid HTTP answer: {_quoted(exc.message)}") from None
    except HttpProcessingError as exc:
        raise Malformed(f"not a valid HTTP answer: {_quoted(exc.message)}") from None
    except aiohttp.ClientError as exc:
        raise Malformed(f"{type(exc).__name__}: {_quoted(str(exc))}") from None


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


def _describe(exc: BaseException) -> str:
    """The exception's class and text; aiohttp's connection errors name host and OS error only."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
    "AiohttpTransport",
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
