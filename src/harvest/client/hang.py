"""Hung endpoints: requests in flight, nothing back, no token generated, while ``/health`` answers.

An engine can answer ``/health`` and ``/v1/models`` while its scheduler or a collective is stuck
(vLLM #13134 logs ``GET /health 200`` while every request hangs): no error ever comes, so the
client's failure runs never see it, and only ``request_timeout`` would, much later and over again.
The :class:`Watchdog` judges an endpoint by what it does instead, every ``interval`` seconds:

1. quiet: requests in flight and nothing sent back since they went out, or since its last answer,
   for longer than the bound of its own recent answers (``Endpoint.hung_after_s``: 3 x their p90,
   ``floor_s`` at least; the bound the panel draws as "no answer for");
2. idle: where the engine has ``/metrics``, its generated-token counter did not move between a
   reading taken half-way through that spell and now (long answers on a busy engine move it);
3. past the bound, the token counter and ``/health`` are read side by side (one moment, one
   verdict): ``/health`` not answering, the endpoint is sick (the client's usual polling and
   deadline; a server harvest launched is relaunched after ``[client] hang_deadline``); answering,
   it is HUNG. The line says which, with the seconds of nothing back when it was seen.

A HUNG endpoint gets no new request; the requests on the wire stay there, and an answer puts it back
in rotation (the client's request path does). ``health_deadline`` seconds after it was found hung it
is DOWN and its requests are abandoned: held by their callers, uncharged, for another endpoint, and
raising ServerSick once every endpoint is down. A server harvest launched is relaunched by the runner
before that, after ``[client] hang_deadline``. Nothing here charges an item, depends on
``request_timeout``, or waits without a bound (each reading within the probe timeout).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from harvest.client.autoconc.readings import GENERATED
from harvest.client.every import Every
from harvest.client.endpoints import HUNG_MIN_S, Endpoint, EndpointPool
from harvest.client.health import Health
from harvest.client.metrics import scrape_metrics
from harvest.client.records import EndpointState
from harvest.errors import HarvestError
from harvest.transport import Transport

log = logging.getLogger("harvest.client")

#: Seconds between two looks at the endpoints.
CHECK_INTERVAL_S = 2.0

def hung_line(quiet_s: float, health: bool = True) -> str:
    """What the panel, the log, the timeline and the report say of an endpoint found quiet, with
    the seconds of nothing back at the moment ``/health``'s answer (or its silence) was seen:
    ``hung: no answer for 152 s while /health answered``, or, ``health`` False (a frozen engine, a
    paused container), ``not answering: no answer for 45 s and /health did not answer``."""
    if health:
        return f"hung: no answer for {quiet_s:.0f} s while /health answered"
    return f"not answering: no answer for {quiet_s:.0f} s and /health did not answer"


class Watchdog:
    """Finds the client's hung endpoints (see the module docstring) and gives them up at their deadline.

    ``transport`` / ``headers``: the client's, for ``/metrics``. ``floor_s``: the shortest quiet
    spell judged (tests shorten it)."""

    def __init__(self, pool: EndpointPool, health: Health, transport: Transport, headers: Mapping[str, str], *,
                 deadline_s: float,
                 probe_timeout: float, sleep: Callable[[float], Awaitable[object]],
                 floor_s: float = HUNG_MIN_S, interval_s: float = CHECK_INTERVAL_S):
        self._pool = pool
        self._health = health
        self._transport, self._headers = transport, headers
        self._deadline_s = deadline_s
        self._probe_timeout = probe_timeout
        self.floor_s = floor_s
        #: endpoint URL -> (the quiet spell's start, the token counter read in it, or None).
        self._readings: dict[str, tuple[float, float | None]] = {}
        self._loop = Every(lambda: self.step(time.monotonic()), interval_s=interval_s, sleep=sleep,
                           failed="hang check failed")

    def ensure_started(self) -> None:
        self._loop.ensure_started()

    async def aclose(self) -> None:
        await self._loop.aclose()

    async def step(self, now: float) -> None:
        """One look at every endpoint (``now``: the request path's monotonic clock)."""
        for endpoint in self._pool.endpoints:
            if endpoint.state is EndpointState.HUNG:
                self._give_up_if_due(endpoint, now)
            elif endpoint.state is EndpointState.HEALTHY:
                await self._judge(endpoint, now)

    async def _judge(self, endpoint: Endpoint, now: float) -> None:
        quiet = endpoint.quiet_s(now)
        bound = endpoint.hung_after_s(self.floor_s)
        if quiet is None or quiet < bound / 2:
            self._readings.pop(endpoint.url, None)
            return
        spell = max(endpoint.busy_since or now, endpoint.last_heard or 0.0)
        seen = self._readings.get(endpoint.url)
        if seen is None or seen[0] != spell or quiet < bound:
            tokens = await self._tokens(endpoint)
            if seen is None or seen[0] != spell or (tokens is not None and seen[1] is not None and tokens > seen[1]):
                self._readings[endpoint.url] = (spell, tokens)  # a new spell, or generating: long answers
            return
        # Past the bound: the token counter and /health read side by side, so the verdict is what
        # the engine was doing at one moment (one after the other, a frozen engine that came back
        # during the first reading would be said to answer /health while it never did).
        tokens, healthy = await asyncio.gather(self._tokens(endpoint), self._health.probe(endpoint))
        if tokens is not None and seen[1] is not None and tokens > seen[1]:
            self._readings[endpoint.url] = (spell, tokens)  # generating: long answers, not a hang
            return
        seen_at = time.monotonic()
        quiet_now = endpoint.quiet_s(seen_at)
        if endpoint.state is not EndpointState.HEALTHY or quiet_now is None:
            return  # it answered meanwhile, or another check took it out
        self._readings.pop(endpoint.url, None)
        line = hung_line(quiet_now, healthy)
        if not healthy:
            endpoint.failed(seen_at, line, None)
            endpoint.seen_down = True
            self._health.make_sick(endpoint, line)
            return
        endpoint.hung_s = quiet_now
        endpoint.failing_since = seen_at
        endpoint.last_error = line
        if self._pool.set_state(endpoint, EndpointState.HUNG):
            log.warning("endpoint %s %s (%d requests in flight, bound %.0f s): no new requests to it",
                        endpoint.url, line, endpoint.outstanding, bound)

    def _give_up_if_due(self, endpoint: Endpoint, now: float) -> None:
        since = endpoint.failing_since if endpoint.failing_since is not None else now
        if now - since < self._deadline_s:
            return
        self._pool.set_state(endpoint, EndpointState.DOWN)
        quiet = endpoint.quiet_s(now)
        endpoint.last_error = hung_line(quiet if quiet is not None else endpoint.hung_s or 0.0)
        held = endpoint.abandon()
        log.error("endpoint %s down: %s, %g s past being found hung; its %d requests in flight are held, "
                  "uncharged", endpoint.url, endpoint.last_error, self._deadline_s, held)

    async def _tokens(self, endpoint: Endpoint) -> float | None:
        """Its generated-token counter now; None without /metrics or without an answer in time."""
        try:
            values = await asyncio.wait_for(
                scrape_metrics(endpoint.url, transport=self._transport, headers=self._headers,
                               timeout=self._probe_timeout, only=GENERATED), self._probe_timeout + 1.0)
        except (HarvestError, asyncio.TimeoutError):
            return None
        found = [values[name] for name in GENERATED if name in values]
        return sum(found) if found else None


__all__ = ["CHECK_INTERVAL_S", "Watchdog", "hung_line"]
