"""The production transport: each HTTP/1.1 exchange on aiohttp's own parts, without its ``ClientSession``.

A base-layer module (aiohttp, yarl, multidict and :mod:`harvest.transport`'s vocabulary): the client,
the quality wire, :mod:`harvest.http` and the notifier send through :class:`AiohttpTransport`; the
caps on what an answer may cost and the exceptions it raises are :mod:`harvest.transport`'s. Every
part of HTTP is aiohttp's: its connector keeps the pool (limits, keep-alive, DNS cache, TLS), its
writer serializes the request head (refusing a line break in a header), its C parser (llhttp) reads the answer with its bounds (128 headers, 8190 bytes a
line), its payload reader inflates a compressed body a bounded piece at a time, and its exceptions
say how an exchange failed. What is left out is the per-request layer of ``ClientSession.request``
(a request object, a response object, cookies, redirects, traces, proxies from the environment),
which harvest never used and which cost more CPU than the rest of the exchange: on loopback,
harvest's client spent 0.32 ms of CPU a request through ``ClientSession`` and spends 0.19 ms here
(P2, ``bench/client_cost.py``, BENCHMARKS.md; a bare ``ClientSession`` loop spends 0.26 ms). The
cost is per request, so it bounds how many requests one client process can drive.

What it relies on beyond aiohttp's documented client API is pinned with aiohttp's version in
``pyproject.toml`` (``BaseConnector.connect`` and ``Connection`` are documented; the response
handler's ``set_response_params`` and ``read`` are aiohttp's own seam between its connection and
its response object). It never follows a redirect, never reads a proxy or a cookie, and never puts
a header or the URL into an exception.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import SERVER_SOFTWARE, StreamWriter
from aiohttp.http_exceptions import ContentLengthError, HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from harvest.transport import (
    _TEXT,
    BIG_READS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_LINE,
    DEFAULT_STREAM_BYTES,
    ERROR_BODY_BYTES,
    FREE_READ,
    EventReader,
    Interrupted,
    Malformed,
    Oversized,
    RawResponse,
    Sink,
    StreamedResponse,
    TimedEvents,
    TimedOut,
    TransportError,
    Unreachable,
    _quoted,
)

#: What every request says of itself, as ``ClientSession`` would (the encodings aiohttp can decode).
_DEFAULT_HEADERS: dict[str, str] = {**{str(name): value for name, value in aiohttp.ClientRequest.DEFAULT_HEADERS.items()},
                                    "User-Agent": SERVER_SOFTWARE}


class Target:
    """A URL as the wire needs it, built once per URL: the connector's key (a request object that
    is never sent), the request line's path and the headers every request to it carries."""

    __slots__ = ("url", "key", "path", "headers")

    def __init__(self, url: URL, loop: asyncio.AbstractEventLoop):
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("not an http(s) URL")
        self.url = url
        self.key = aiohttp.ClientRequest("GET", url, loop=loop)
        self.path = url.raw_path_qs or "/"
        self.headers = CIMultiDict({"Host": url.host_port_subcomponent or url.raw_host or "", **_DEFAULT_HEADERS})
        if url.user is not None:  # credentials in the URL, as ClientSession sends them
            credentials = f"{url.user}:{url.password or ''}".encode("latin-1", "replace")
            self.headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode("ascii")


class Answer:
    """An answer whose head has been read: its status and headers, its body still on the wire in
    ``content``. Its connection goes back to the pool with :meth:`release` once the body is read
    to its end, or is closed with :meth:`close` (a body left unread, a failure)."""

    __slots__ = ("status", "headers", "content", "protocol", "_conn")

    def __init__(self, status: int, headers: CIMultiDictProxy[str], content: aiohttp.StreamReader,
                 conn: aiohttp.connector.Connection):
        self.status, self.headers, self.content, self._conn = status, headers, content, conn
        self.protocol: Any = conn.protocol  # aiohttp's ResponseHandler

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def release(self) -> None:
        """The body was read to its end: the connection may serve another request."""
        self._conn.release()

    def close(self) -> None:
        """The connection is not used again (closed now)."""
        self._conn.close()


async def send(connector: aiohttp.BaseConnector, target: Target, method: str, body: bytes | None,
               headers: Any, timeout: aiohttp.ClientTimeout) -> Answer:
    """Send one request over a pooled connection of ``connector`` (``timeout.sock_connect`` bounds
    a new connection) and read the head of its answer (informational 1xx answers skipped). Raises
    aiohttp's exceptions; the caller bounds the whole exchange and closes or releases the answer."""
    conn = await connector.connect(target.key, [], timeout)
    try:
        protocol = conn.protocol
        assert isinstance(protocol, ResponseHandler)
        protocol.set_response_params(skip_payload=method == "HEAD")
        head = target.headers.copy()
        if headers:
            head.update(headers)  # the caller's names replace the defaults whatever their case
        if body is not None:
            head["Content-Length"] = str(len(body))
        writer = StreamWriter(protocol, asyncio.get_running_loop())
        try:
            await writer.write_headers(f"{method} {target.path} HTTP/1.1", head)
            await writer.write_eof(body or b"")
        except OSError as exc:  # the connection broke under the request (as ClientSession says it)
            raise aiohttp.ClientOSError(exc.errno, f"Can not write request body: {exc}") from exc
        while True:
            message, payload = await protocol.read()
            if not 100 <= message.code < 200 or message.code == 101:
                return Answer(message.code, message.headers, payload, conn)
    except BaseException:
        conn.close()
        raise


class _LostBodies:
    """Wakes a body's reader whose connection was lost before the body ended without aiohttp
    telling the reader: its C parser, given a body that breaks HTTP's framing mid-way (a chunk size
    that is not hexadecimal), closes the connection and leaves the reader waiting until the
    request's timeout (aiohttp 3.14). Only bodies read in several pieces are watched; one callback
    per connection, on aiohttp's own "closed" future (its outcome retrieved here)."""

    def __init__(self) -> None:
        self._reading: dict[int, aiohttp.StreamReader] = {}
        self._watched: set[int] = set()

    def watch(self, answer: Answer) -> int | None:
        """Watch ``answer``'s body while it is read; the key to :meth:`done`, or None."""
        protocol = answer.protocol
        if protocol is None:
            return None
        key = id(protocol)
        if key not in self._watched:
            closed = protocol.closed
            if closed is None:  # already lost: aiohttp has told the reader
                return None
            self._watched.add(key)
            closed.add_done_callback(lambda f: self._lost(key, protocol, f))
        self._reading[key] = answer.content
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
    """One aiohttp connection pool (``TCPConnector``) with explicit limits, created on first use; each
    exchange on aiohttp's own wire without a ``ClientSession`` (the module's docstring says why)."""

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
        self._pool: aiohttp.TCPConnector | None = None
        #: Connections used once (``force_close``): where a request the server hung up on is tried again.
        self._fresh: aiohttp.TCPConnector | None = None
        self._closed = False
        # Parsing a URL and building a timeout object cost more than the rest of the request path;
        # the client uses a handful of each, so they are built once.
        self._targets: dict[str, Target] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._lost = _LostBodies()
        self._turns: asyncio.Semaphore | None = None  # made with the pool, on its loop

    def _open(self) -> aiohttp.TCPConnector:
        if self._closed:
            raise RuntimeError("transport is closed")
        self._pool = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                          keepalive_timeout=self._keepalive_timeout, ttl_dns_cache=300)
        self._turns = asyncio.Semaphore(BIG_READS)
        return self._pool

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=min(self._connect_timeout, seconds))
            if len(self._timeouts) < 32:  # a retry's leftover seconds are one-off values
                self._timeouts[seconds] = timeout
        return timeout

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            try:
                target = Target(URL(url), asyncio.get_running_loop())
            except ValueError as exc:  # its text may quote the URL (a key in its query): not kept
                raise Unreachable(f"{type(exc).__name__}: not an http(s) URL with a host and a port") from None
            if len(self._targets) < 256:
                self._targets[url] = target
        return target

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> RawResponse:
        pool = self._pool or self._open()
        target = self._target(url)
        started = time.monotonic()
        try:
            return await self._send(pool, method, target, body, headers, timeout, max_bytes)
        except Interrupted as exc:
            if not exc.closed_unanswered:
                raise
            first = exc
        left = timeout - (time.monotonic() - started)
        if left <= 0 or self._closed:  # closed meanwhile (the client ending): no new pool to leak
            raise first
        if self._fresh is None:
            # Another pooled connection may be as stale as the first (a client that read its answers
            # late, on a loaded machine, reuses all of them late): a new connection, used once.
            self._fresh = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, force_close=True)
        try:  # once more, on a new connection
            return await self._send(self._fresh, method, target, body, headers, left, max_bytes)
        except TransportError:
            raise first from None

    async def _send(self, pool: aiohttp.TCPConnector, method: str, target: Target, body: bytes | None,
                    headers: Mapping[str, str] | None, timeout: float, max_bytes: int) -> RawResponse:
        with _failures(timeout):
            async with _within(timeout):
                answer = await send(pool, target, method, body, headers, self._timeout(timeout))
                try:
                    status = answer.status
                    if 200 <= status < 300:
                        data = await _read_body(answer, max_bytes, self._lost, turns=self._turns)
                        return RawResponse(status, data)
                    data = await _read_body(answer, min(max_bytes, ERROR_BODY_BYTES), self._lost, keep_first=True)
                    return RawResponse(status, data, *_extra_headers(answer))
                finally:
                    _done(answer)

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
        pool = self._pool or self._open()
        target = self._target(url)
        started = time.monotonic()
        with _failures(timeout):
            async with _within(timeout):
                answer = await send(pool, target, "POST", body, headers, self._timeout(timeout))
                try:
                    if answer.status != 200:
                        data = await _read_body(answer, min(max_bytes, ERROR_BODY_BYTES), self._lost, keep_first=True)
                        return StreamedResponse(answer.status, False, data, *_extra_headers(answer))
                    events = EventReader(sink, started, max_bytes, max_line)
                    content = answer.content
                    watch, turn = self._lost.watch(answer), _Turn(self._turns)
                    try:
                        while await turn.fits(events.held) and (chunk := await content.readany()):
                            if not events.feed(chunk):
                                answer.close()  # the sink had enough: the rest of the stream is not read
                                return StreamedResponse(answer.status, True)
                    finally:
                        self._lost.done(watch)
                        turn.end()
                    return StreamedResponse(answer.status, not events.end())
                finally:
                    _done(answer)

    async def aclose(self) -> None:
        self._closed = True
        for pool in (self._pool, self._fresh):
            if pool is not None:
                await pool.close()
        self._pool = self._fresh = None


def _done(answer: Answer) -> None:
    """The answer's connection back to the pool when its body was read to the end, else closed
    (an answer cut short, failed, or cancelled: what is left of it on the wire is never read)."""
    if answer.content.is_eof() and answer.content.exception() is None:
        answer.release()
    else:
        answer.close()


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


async def _read_body(resp: Answer, cap: int, lost: _LostBodies, *, keep_first: bool = False,
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


def _extra_headers(resp: Answer) -> tuple[str | None, str | None]:
    """``(Retry-After, Location)`` of a failed answer: the first for 4xx/5xx, the second for 3xx."""
    status = resp.status
    return (resp.headers.get("Retry-After") if status >= 400 else None,
            resp.headers.get("Location") if 300 <= status < 400 else None)


if sys.version_info >= (3, 11):
    _within = asyncio.timeout  # the whole exchange: TimeoutError once its seconds are over
else:  # pragma: no cover - aiohttp brings async-timeout on 3.10
    from async_timeout import timeout as _within


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


def _describe(exc: BaseException) -> str:
    """The exception's class and text; aiohttp's connection errors name host and OS error only."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["AiohttpTransport", "Answer", "Target", "send"]
