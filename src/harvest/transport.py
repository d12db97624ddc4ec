"""The seam between the client's policy and the HTTP library: one request in, one raw response out.

A base-layer leaf (aiohttp and yarl only, no harvest import): the client, the quality wire and the
sync helper :mod:`harvest.http` share it, each importing downward.

A transport sends one request and returns the status and body, or raises one of three exceptions
that say, by type, how the exchange failed: :class:`Unreachable` (no connection), :class:`Interrupted`
(connection lost after sending) or :class:`TimedOut`. It never interprets a status, never logs, and
never puts request headers (the API key) into an exception. It retries one thing only, once: a
request the server closed its connection on without answering (``ServerDisconnectedError``, or a
``ClientOSError`` such as a broken pipe while the request was being written). That is the race of a
kept-alive connection the server closes just as the client reuses it (HTTP/1.1 allows it; seen at
128+ requests in flight on vLLM, where three at once made an endpoint "sick"),
and a second connection settles it; when the second try fails too, the first failure is raised, so
a server that died under a request still reads as :class:`Interrupted`, not :class:`Unreachable`.

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
from typing import Protocol, Union

import aiohttp
from yarl import URL


class TransportError(Exception):
    """Base of the three ways an exchange can fail without an HTTP status."""


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


@dataclass(frozen=True)
class RawResponse:
    """An HTTP answer as the transport received it."""

    status: int
    body: bytes
    #: The ``Retry-After`` header, verbatim, when the server sent one.
    retry_after: str | None = None


@dataclass(frozen=True)
class TimedEvents:
    """A streamed answer (server-sent events) as the transport received it: when each event came."""

    status: int
    #: Seconds from sending the request to the arrival of each ``data:`` event that carries text.
    arrivals: tuple[float, ...]


@dataclass(frozen=True)
class StreamedResponse:
    """A streamed answer (``"stream": true``) as the transport received it: each server-sent
    ``data:`` payload with its arrival, seconds after the request was sent. A status other than 200
    carries the whole body instead (the error text), and no events."""

    status: int
    #: ``(arrival_s, payload)`` of every ``data:`` line, ``[DONE]`` left out, in arrival order.
    events: tuple[tuple[float, bytes], ...]
    body: bytes = b""
    retry_after: str | None = None


class Transport(Protocol):
    """What the client needs from an HTTP library. Lifecycle: create, ``request`` many times, ``aclose``."""

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float) -> RawResponse:
        """Send one request; return the whole response or raise a :class:`TransportError`."""

    async def timed_events(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                           timeout: float, arrivals: list[float] | None = None) -> TimedEvents:
        """POST a streaming request; return when each of its events arrived (also appended to
        ``arrivals`` as they come), or raise a :class:`TransportError`. Never tried again."""

    async def stream(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                     timeout: float) -> StreamedResponse:
        """POST a streaming request; return its ``data:`` payloads with their arrivals, or raise a
        :class:`TransportError`. Not tried again: the server may have started generating."""

    async def aclose(self) -> None:
        """Close every connection. Idempotent."""


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

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("transport is closed")
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         keepalive_timeout=self._keepalive_timeout, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                              raise_for_status=False, trust_env=False)
        return self._session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=min(self._connect_timeout, seconds))
            if len(self._timeouts) < 32:  # a retry's leftover seconds are one-off values
                self._timeouts[seconds] = timeout
        return timeout

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float) -> RawResponse:
        session = self._session or self._open()
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = URL(url)
        started = time.monotonic()
        try:
            return await self._send(session, method, target, body, headers, timeout)
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
            return await self._send(self._fresh, method, target, body, headers, left)
        except TransportError:
            raise first from None

    async def _send(self, session: aiohttp.ClientSession, method: str, target: URL, body: bytes | None,
                    headers: Mapping[str, str] | None, timeout: float) -> RawResponse:
        with _failures(timeout):
            async with session.request(method, target, data=body, headers=headers,
                                       timeout=self._timeout(timeout), allow_redirects=False) as resp:
                data = await resp.read()
                retry_after = resp.headers.get("Retry-After") if resp.status >= 400 else None
                return RawResponse(resp.status, data, retry_after)

    async def timed_events(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                           timeout: float, arrivals: list[float] | None = None) -> TimedEvents:
        session = self._session or self._open()
        started = time.monotonic()
        arrivals = [] if arrivals is None else arrivals
        with _failures(timeout):
            async with session.post(URL(url), data=body, headers=headers, timeout=self._timeout(timeout),
                                    allow_redirects=False) as resp:
                if resp.status != 200:
                    await resp.read()
                    return TimedEvents(resp.status, ())
                async for line in resp.content:
                    if _carries_text(line):
                        arrivals.append(time.monotonic() - started)
                return TimedEvents(resp.status, tuple(arrivals))

    async def stream(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                     timeout: float) -> StreamedResponse:
        session = self._session or self._open()
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = URL(url)
        started = time.monotonic()
        events: list[tuple[float, bytes]] = []
        with _failures(timeout):
            async with session.post(target, data=body, headers=headers, timeout=self._timeout(timeout),
                                    allow_redirects=False) as resp:
                if resp.status != 200:
                    retry_after = resp.headers.get("Retry-After") if resp.status >= 400 else None
                    return StreamedResponse(resp.status, (), await resp.read(), retry_after)
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        if payload and payload != b"[DONE]":
                            events.append((time.monotonic() - started, payload))
                return StreamedResponse(resp.status, tuple(events))

    async def aclose(self) -> None:
        self._closed = True
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None


@contextlib.contextmanager
def _failures(timeout: float) -> Iterator[None]:
    """aiohttp's exceptions as the three of this module."""
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
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise Interrupted(_describe(exc)) from None


#: A server-sent event that carries generated text: a chat delta's content (or reasoning) or a
#: completion's text, not empty. A server may send a role-only chunk before any token (it would
#: read as a first token that never waited) and a usage-only one after the last.
_TEXT = re.compile(rb'"(?:content|reasoning_content|text)"\s*:\s*"[^"]')


def _carries_text(line: bytes) -> bool:
    return line.startswith(b"data:") and _TEXT.search(line) is not None


def _describe(exc: BaseException) -> str:
    """The exception's class and text; aiohttp's connection errors name host and OS error only."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: A handler for :class:`MockTransport`: (method, url, body, headers) -> response, sync or async.
Handler = Callable[[str, str, Union[bytes, None], Mapping[str, str]],
                   Union[RawResponse, Awaitable[RawResponse]]]


class MockTransport:
    """A transport that answers every request by calling ``handler``, without a network.

    The handler may return a :class:`RawResponse` (or an awaitable of one) or raise
    :class:`Unreachable`, :class:`Interrupted` or :class:`TimedOut` to play a failing server. The
    request's ``timeout`` is enforced around an async handler, as a real transport would.
    """

    def __init__(self, handler: Handler):
        self._handler = handler
        self.closed = False

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float) -> RawResponse:
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
        raw = await self.request("POST", url, body=body, headers=headers, timeout=timeout)
        at = time.monotonic() - started
        events = [at for line in raw.body.splitlines() if _carries_text(line)]
        if arrivals is not None:
            arrivals.extend(events)
        return TimedEvents(raw.status, tuple(events))

    async def stream(self, url: str, *, body: bytes, headers: Mapping[str, str] | None = None,
                     timeout: float) -> StreamedResponse:
        """The handler's answer split into its ``data:`` payloads, all arriving when it returned."""
        started = time.monotonic()
        raw = await self.request("POST", url, body=body, headers=headers, timeout=timeout)
        if raw.status != 200:
            return StreamedResponse(raw.status, (), raw.body, raw.retry_after)
        at = time.monotonic() - started
        payloads = [line[5:].strip() for line in raw.body.splitlines() if line.startswith(b"data:")]
        return StreamedResponse(raw.status, tuple((at, p) for p in payloads if p and p != b"[DONE]"))

    async def aclose(self) -> None:
        self.closed = True


__all__ = [
    "AiohttpTransport",
    "Handler",
    "Interrupted",
    "MockTransport",
    "RawResponse",
    "StreamedResponse",
    "TimedEvents",
    "TimedOut",
    "Transport",
    "TransportError",
    "Unreachable",
]
