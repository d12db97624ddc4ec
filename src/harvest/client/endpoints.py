"""The endpoints a client spreads requests over: their recorded state and the choice of the next one.

The pool picks the healthy endpoint with the fewest outstanding requests (ties go round-robin) and
lets waiters sleep until some endpoint changes state. It only *records* state; measuring it (health
probes) and deciding it (failure runs, deadlines) are the client's job. It never does I/O.

A request with an *affinity* key (its prompt prefix: a system prompt, a conversation; see
``campaign/run/order.py``) goes to the server that likely holds that prefix in its cache: the healthy
endpoints are ranked by rendezvous hashing of the key (the same key, the same server, and a server
that leaves or comes back moves only its own keys), and the first in that rank takes it unless its
load is past ``AFFINITY_SLACK`` x the average (consistent hashing with bounded loads), so a server
that lags or holds a hot prefix sheds the excess to the next in rank instead of queueing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import sys
from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from harvest.client.records import EndpointState, EndpointStats
from harvest.errors import ConfigError

#: An endpoint takes a request of its affinity key while its load stays within this x the average.
AFFINITY_SLACK = 1.25
#: An endpoint with requests in flight that sent nothing back for max(HUNG_MIN_S, HUNG_P90_FACTOR x
#: the p90 latency of its recent answers) is shown as not answering (a hung server holds connections
#: open: no error comes, so it never turns sick by itself before request_timeout).
HUNG_MIN_S = 30.0
HUNG_P90_FACTOR = 3.0
#: Answers whose latency the p90 is taken over.
LATENCY_WINDOW = 256

T = TypeVar("T")


class Abandoned(Exception):
    """The request's endpoint was given up while the request was on the wire (:meth:`Endpoint.abandon`)."""


def normalize_url(url: str) -> str:
    """A base URL without trailing slash or ``/v1``; ConfigError unless it is http(s)://host[:port].
    A query (a key an endpoint takes as ``?api_key=``) is kept after it: see :func:`endpoint_url`."""
    head, sep_q, query = url.strip().partition("?")
    base = head.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    scheme, sep, rest = base.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or rest.startswith("/"):
        raise ConfigError("client endpoints", [(url, "must look like http://host:port (optionally ending in /v1)")])
    return base + sep_q + query


def endpoint_url(base: str, path: str) -> str:
    """``path`` (``/v1/chat/completions``) on the endpoint ``base``, whose query, if any, stays at
    the end: ``http://h:8?api_key=K`` + ``/v1/models`` is ``http://h:8/v1/models?api_key=K``."""
    head, sep, query = base.partition("?")
    if not sep:
        return head + path
    return head + path + ("&" if "?" in path else "?") + query


class Endpoint:
    """Mutable state of one endpoint, owned by one client (never shared between clients)."""

    __slots__ = ("url", "state", "outstanding", "completed", "run", "failing_since", "seen_down",
                 "last_error", "last_status", "recovery", "probe", "limit", "peak", "busy_since", "last_heard",
                 "latencies", "wire", "hung_s")

    def __init__(self, url: str):
        self.url = url
        self.state = EndpointState.HEALTHY
        self.outstanding = 0
        self.completed = 0
        #: Consecutive server-side failures since the last answer; enough of them make it sick.
        self.run = 0
        #: Clock time of the first failure of the current run (the health deadline counts from it).
        self.failing_since: float | None = None
        #: True once this sickness was confirmed by a refused connection or a failed health probe.
        self.seen_down = False
        self.last_error: str | None = None
        self.last_status: int | None = None
        self.recovery: asyncio.Task[None] | None = None
        self.probe: asyncio.Task[bool] | None = None
        #: Requests it may hold at once (``concurrency = "auto"`` sets it); None: no bound of its own.
        self.limit: int | None = None
        #: The most requests it held at once since the auto-concurrency step last looked.
        self.peak = 0
        #: Clock time its outstanding count last rose from 0, and of the last answer it sent (any
        #: status): a quiet endpoint with requests in flight is measured from the later of the two.
        self.busy_since: float | None = None
        self.last_heard: float | None = None
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        #: The tasks waiting for an answer from it (:meth:`carry`), each with whether it was given up.
        self.wire: dict[asyncio.Future[Any], bool] = {}  # Any: whatever the transport answers
        #: Seconds it had sent nothing back when it was found hung; None unless it was.
        self.hung_s: float | None = None

    def took(self, now: float) -> None:
        """One more request went out to it."""
        if self.outstanding == 0:
            self.busy_since = now
        self.outstanding += 1
        self.peak = max(self.peak, self.outstanding)

    def heard(self, now: float, latency_s: float | None = None) -> None:
        """It sent an answer back (``latency_s``: a completion's, for the p90)."""
        self.last_heard = now
        if latency_s is not None:
            self.latencies.append(latency_s)

    def quiet_s(self, now: float) -> float | None:
        """Seconds it has had requests in flight without sending anything back; None when idle."""
        if self.outstanding <= 0 or self.busy_since is None:
            return None
        return now - max(self.busy_since, self.last_heard or self.busy_since)

    def hung_after_s(self, floor_s: float = HUNG_MIN_S) -> float:
        """How long a quiet spell may last before it counts as not answering: ``HUNG_P90_FACTOR`` x
        the p90 latency of its recent answers, ``floor_s`` at least."""
        if not self.latencies:
            return floor_s
        ordered = sorted(self.latencies)
        p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
        return max(floor_s, HUNG_P90_FACTOR * p90)

    async def carry(self, request: Awaitable[T]) -> T:
        """``request``'s answer, the request on the wire to this endpoint: :class:`Abandoned` when
        the endpoint is given up meanwhile (:meth:`abandon`); the caller's own cancellation propagates.
        The request runs in the caller's task (a task of its own per request cost each request CPU:
        P2 in BENCHMARKS.md); an abandonment cancels that task, told apart from any other
        cancellation by the task's cancellation count."""
        if sys.version_info < (3, 11):  # no cancellation count: the request in a task of its own
            return await self._carry_apart(request)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Endpoint.carry outside a task")
        before = task.cancelling()
        self.wire[task] = False
        try:
            return await request
        except asyncio.CancelledError:
            if not self.wire.get(task) or task.uncancel() > before:  # cancelled by someone else too
                raise
            raise Abandoned from None
        finally:
            del self.wire[task]

    async def _carry_apart(self, request: Awaitable[T]) -> T:
        future = asyncio.ensure_future(request)
        self.wire[future] = False
        try:
            await asyncio.wait((future,))  # the caller's own cancellation propagates from here
        finally:
            del self.wire[future]
            if not future.done():
                future.cancel()
        if future.cancelled():
            raise Abandoned
        return future.result()

    def abandon(self) -> int:
        """Give up the requests on the wire to it (their callers hold them, uncharged, for another
        endpoint or a revival): each waiting task is cancelled once; returns how many."""
        wire = [waiter for waiter, given_up in self.wire.items() if not given_up and not waiter.done()]
        for waiter in wire:
            self.wire[waiter] = True
            waiter.cancel()
        return len(wire)

    def has_room(self) -> bool:
        return self.limit is None or self.outstanding < self.limit

    def answered(self) -> None:
        """The server answered (a success or the item's own 4xx): the failure run is over."""
        self.run = 0
        self.failing_since = None

    def failed(self, now: float, error: str, status: int | None) -> None:
        """One more server-side failure in the current run."""
        if self.run == 0 or self.failing_since is None:
            self.failing_since = now
        self.run += 1
        self.last_error = error
        if status is not None:
            self.last_status = status

    def stats(self, now: float, floor_s: float = HUNG_MIN_S) -> EndpointStats:
        quiet = self.quiet_s(now)
        return EndpointStats(url=self.url, state=self.state, outstanding=self.outstanding,
                             completed=self.completed, consecutive_failures=self.run,
                             last_error=self.last_error, target=self.limit, failing_since=self.failing_since,
                             quiet_s=None if quiet is None else round(quiet, 1),
                             hung_after_s=round(self.hung_after_s(floor_s), 1), hung_s=self.hung_s)


class EndpointPool:
    """The endpoints of one client, the least-outstanding choice and a "something changed" signal.

    With per-endpoint limits (``concurrency = "auto"``) an endpoint at its limit is passed over, the
    choice goes to the lowest outstanding/limit, and callers that found every healthy endpoint full
    queue in :meth:`wait_room` (first come, first woken) until a request ends or a limit rises.
    """

    def __init__(self, urls: Sequence[str]):
        if not urls:
            raise ConfigError("client endpoints", [("endpoints", "at least one endpoint is needed")])
        normalized = [normalize_url(u) for u in urls]
        duplicates = sorted({u for u in normalized if normalized.count(u) > 1})
        if duplicates:
            raise ConfigError("client endpoints", [("endpoints", f"listed more than once: {', '.join(duplicates)}")])
        self.endpoints = tuple(Endpoint(u) for u in normalized)
        self._next = 0
        self._changed = asyncio.Event()
        self._room: deque[asyncio.Future[None]] = deque()

    def choose(self, affinity: str | None = None) -> Endpoint | None:
        """The healthy endpoint with the fewest outstanding requests (relative to its limit, when it
        has one), or with ``affinity`` the first of the key's rank within its bounded load; None when
        none is healthy or every healthy one is at its limit."""
        endpoints = self.endpoints
        count = len(endpoints)
        if count == 1:
            only = endpoints[0]
            return only if only.state is EndpointState.HEALTHY and only.has_room() else None
        if affinity is not None:
            chosen = self._affine(affinity)
            if chosen is not None:
                return chosen
        start = self._next
        self._next = (start + 1) % count
        best: Endpoint | None = None
        best_load = 0.0
        for i in range(count):
            candidate = endpoints[(start + i) % count]
            if candidate.state is not EndpointState.HEALTHY or not candidate.has_room():
                continue
            load = candidate.outstanding / candidate.limit if candidate.limit else float(candidate.outstanding)
            if best is None or load < best_load:
                best, best_load = candidate, load
        return best

    def _affine(self, key: str) -> Endpoint | None:
        """The first endpoint of ``key``'s rendezvous rank that has room and a load within the bound."""
        live = [e for e in self.endpoints if e.state is EndpointState.HEALTHY and e.has_room()]
        if not live:
            return None
        weight = sum(e.limit or 1 for e in live)
        average = (sum(e.outstanding for e in live) + 1) / weight
        for endpoint in sorted(live, key=lambda e: _rank(key, e.url), reverse=True):
            bound = max(1, math.ceil(AFFINITY_SLACK * average * (endpoint.limit or 1)))
            if endpoint.outstanding + 1 <= bound:
                return endpoint
        return None

    def any_healthy(self) -> bool:
        return any(e.state is EndpointState.HEALTHY for e in self.endpoints)

    def release(self, endpoint: Endpoint) -> None:
        """A request to ``endpoint`` ended: one less outstanding; wake the first caller waiting for room."""
        endpoint.outstanding -= 1
        if endpoint.outstanding <= 0:
            endpoint.busy_since = None
        if endpoint.limit is not None:
            self._wake(1)

    def set_limit(self, endpoint: Endpoint, limit: int | None) -> None:
        """Set ``endpoint``'s own bound; waiters are woken when it rose."""
        before, endpoint.limit = endpoint.limit, limit
        if limit is None or before is None or limit > before:
            self._wake(len(self._room) if limit is None or before is None else limit - before)

    async def wait_room(self, timeout: float) -> bool:
        """Wait until a request ends, a limit rises or a state changes; False after ``timeout`` s."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter.cancelled():
                # Timed out or cancelled: still queued unless a wake skipped it. A woken waiter was
                # taken off the queue by the wake: no scan for it (a scan of every caller waiting,
                # 16,384 of them in a bench, for each request that ends).
                with contextlib.suppress(ValueError):
                    self._room.remove(waiter)
        return True

    def _wake(self, count: int) -> None:
        while count > 0 and self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    def all_down(self) -> bool:
        return all(e.state is EndpointState.DOWN for e in self.endpoints)

    def set_state(self, endpoint: Endpoint, state: EndpointState) -> bool:
        """Record a new state; wake every waiter. False when the endpoint was already in that state."""
        if endpoint.state is state:
            return False
        endpoint.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        self._wake(len(self._room))
        return True

    async def wait_changed(self, timeout: float) -> bool:
        """Sleep until some endpoint changes state; False if ``timeout`` seconds pass first."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def stats(self, now: float, floor_s: float = HUNG_MIN_S) -> tuple[EndpointStats, ...]:
        return tuple(e.stats(now, floor_s) for e in self.endpoints)


def _rank(key: str, url: str) -> int:
    """Rendezvous (highest random weight) score of ``url`` for ``key``."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest(), "big")


__all__ = ["AFFINITY_SLACK", "HUNG_MIN_S", "HUNG_P90_FACTOR", "Endpoint", "EndpointPool", "normalize_url"]
