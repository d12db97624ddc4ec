"""Blocking HTTP for the few sync callers: readiness probes, an engine's capacity query, test helpers.

harvest uses one HTTP library, aiohttp, for all of its requests: the client's hot path, the quality
wire, readiness and the adapters' queries. It was chosen by P2 (BENCHMARKS.md, ``bench/client_cost.py``):
a bare aiohttp loop spends about x14-x17 fewer CPU seconds per request than a bare httpx loop on the
same null server. The async callers use :class:`harvest.aiohttp_transport.AiohttpTransport` directly;
this module gives the sync ones the same transport, run on a private event loop in a thread of its
own, so it works from any thread, an event loop's included (the caller blocks, as a sync call does).

Promises:

- Every request has a timeout (a required argument): the transport bounds the whole exchange, and the
  caller's wait on the private loop is bounded too, a little longer.
- Never an environment proxy (``trust_env=False``, as in the client): the servers harvest talks to
  are on loopback or behind its own SSH tunnel, and a loopback probe through ``HTTP_PROXY`` would
  test the proxy, not the server.
- A request that gets no HTTP answer raises :class:`HttpError` (its cause is the transport's
  :class:`~harvest.transport.Unreachable`, :class:`~harvest.transport.Interrupted` or
  :class:`~harvest.transport.TimedOut`, or aiohttp's error for an answer that is not HTTP);
  a status is never an exception here: callers read it.

It never retries, never logs, and never puts request headers (an API key) into an error.
aiohttp and the client's transport are imported when the first :class:`SyncHttp` opens, so that the
modules importing this one (the server layer, the CLI's stop path) do not pay for them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json as jsonlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harvest.transport import Transport

#: How much longer than a request's own timeout the caller waits on the private loop.
_WAIT_MARGIN_S = 5.0


class HttpError(Exception):
    """A request got no HTTP answer: unreachable, interrupted or timed out (see ``__cause__``)."""


@dataclass(frozen=True)
class Response:
    """A whole HTTP answer."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body decoded as JSON; raises ``ValueError`` when it is not JSON."""
        return jsonlib.loads(self.body)


class SyncHttp:
    """Blocking requests over one aiohttp session on a private event loop; a context manager.

    ``transport`` replaces the aiohttp transport (a :class:`harvest.transport.MockTransport`
    in tests); it is closed with this object.
    """

    def __init__(self, *, max_connections: int = 4, connect_timeout: float = 10.0,
                 transport: Transport | None = None):
        from harvest.aiohttp_transport import AiohttpTransport

        self._transport = transport or AiohttpTransport(max_connections=max_connections,
                                                        connect_timeout=connect_timeout)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="harvest-http", daemon=True)
        self._thread.start()
        self._closed = False
        self._lock = threading.Lock()

    def request(self, method: str, url: str, *, timeout: float, json: Any = None,
                headers: Mapping[str, str] | None = None) -> Response:
        """Send one request (``json``: a body to encode) and return the whole answer, any status.

        Raises :class:`HttpError` when no answer came within ``timeout`` seconds or the connection
        failed."""
        from aiohttp import ClientError

        from harvest.transport import TransportError

        if self._closed:
            raise RuntimeError("SyncHttp is closed")
        sent = dict(headers or {})
        body = None
        if json is not None:
            body = jsonlib.dumps(json).encode()
            sent.setdefault("Content-Type", "application/json")
        future = asyncio.run_coroutine_threadsafe(
            self._transport.request(method, url, body=body, headers=sent, timeout=timeout), self._loop)
        try:
            raw = future.result(timeout + _WAIT_MARGIN_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise HttpError(f"{method} {url}: no answer within {timeout:g} s") from None
        except (TransportError, ClientError) as exc:  # ClientError: what the transport leaves (a bad answer)
            raise HttpError(f"{method} {url}: {exc}") from exc
        return Response(raw.status, raw.body)

    def get(self, url: str, *, timeout: float, headers: Mapping[str, str] | None = None) -> Response:
        return self.request("GET", url, timeout=timeout, headers=headers)

    def post(self, url: str, *, timeout: float, json: Any = None,
             headers: Mapping[str, str] | None = None) -> Response:
        return self.request("POST", url, timeout=timeout, json=json, headers=headers)

    def close(self) -> None:
        """Close the connections and stop the private loop; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._transport.aclose(), self._loop).result(_WAIT_MARGIN_S)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # the loop is stopped below either way; the sockets close with it
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_WAIT_MARGIN_S)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(method: str, url: str, *, timeout: float, json: Any = None,
            headers: Mapping[str, str] | None = None) -> Response:
    """One request on a session of its own (for one-off calls; a loop of calls keeps a :class:`SyncHttp`)."""
    with SyncHttp(max_connections=1) as http:
        return http.request(method, url, timeout=timeout, json=json, headers=headers)


def get(url: str, *, timeout: float, headers: Mapping[str, str] | None = None) -> Response:
    return request("GET", url, timeout=timeout, headers=headers)


def post(url: str, *, timeout: float, json: Any = None, headers: Mapping[str, str] | None = None) -> Response:
    return request("POST", url, timeout=timeout, json=json, headers=headers)


__all__ = ["HttpError", "Response", "SyncHttp", "get", "post", "request"]
