"""The endpoints a client spreads requests over: their recorded state and the choice of the next one.

The pool picks the healthy endpoint with the fewest outstanding requests (ties go round-robin) and
lets waiters sleep until some endpoint changes state. It only *records* state; measuring it (health
probes) and deciding it (failure runs, deadlines) are the client's job. It never does I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from harvest.client.records import EndpointState, EndpointStats
from harvest.errors import ConfigError


def normalize_url(url: str) -> str:
    """A base URL without trailing slash or ``/v1``; ConfigError unless it is http(s)://host[:port]."""
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    scheme, sep, rest = base.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or rest.startswith("/"):
        raise ConfigError("client endpoints", [(url, "must look like http://host:port (optionally ending in /v1)")])
    return base


class Endpoint:
    """Mutable state of one endpoint, owned by one client (never shared between clients)."""

    __slots__ = ("url", "state", "outstanding", "completed", "run", "failing_since", "seen_down",
                 "last_error", "last_status", "recovery", "probe")

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

    def stats(self) -> EndpointStats:
        return EndpointStats(url=self.url, state=self.state, outstanding=self.outstanding,
                             completed=self.completed, consecutive_failures=self.run,
                             last_error=self.last_error)


class EndpointPool:
    """The endpoints of one client, the least-outstanding choice and a "something changed" signal."""

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

    def choose(self) -> Endpoint | None:
        """The healthy endpoint with the fewest outstanding requests; None when none is healthy."""
        endpoints = self.endpoints
        count = len(endpoints)
        if count == 1:
            only = endpoints[0]
            return only if only.state is EndpointState.HEALTHY else None
        start = self._next
        self._next = (start + 1) % count
        best: Endpoint | None = None
        for i in range(count):
            candidate = endpoints[(start + i) % count]
            if candidate.state is EndpointState.HEALTHY and (best is None or candidate.outstanding < best.outstanding):
                best = candidate
        return best

    def all_down(self) -> bool:
        return all(e.state is EndpointState.DOWN for e in self.endpoints)

    def set_state(self, endpoint: Endpoint, state: EndpointState) -> bool:
        """Record a new state; wake every waiter. False when the endpoint was already in that state."""
        if endpoint.state is state:
            return False
        endpoint.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    async def wait_changed(self, timeout: float) -> bool:
        """Sleep until some endpoint changes state; False if ``timeout`` seconds pass first."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def stats(self) -> tuple[EndpointStats, ...]:
        return tuple(e.stats() for e in self.endpoints)


__all__ = ["Endpoint", "EndpointPool", "normalize_url"]
