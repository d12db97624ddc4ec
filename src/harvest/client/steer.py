"""The loop that steers ``concurrency = "auto"``: one controller per endpoint, fed once per step.

Every ``interval_s`` it scrapes each healthy endpoint's ``/metrics`` (all at once, each bounded by
three steps: a late reading is still one), hands the gauges and the time to that endpoint's
:class:`~harvest.client.autoconc.AutoConcurrency`, and writes the new target into the pool, which
gates dispatch per endpoint. An endpoint whose /metrics is missing (404) steers on a canary
(:mod:`harvest.client.canary`) when the client gave one, else, or when it does not stream, on its
answers alone; a missing /metrics is asked again only every ``rescrape_every`` steps. An endpoint
whose scrapes bring the same settled decision with nothing left to move soon
(:meth:`~harvest.client.autoconc.AutoConcurrency.scrape_rests`) is scraped every 2, then 4, then
``QUIET_MAX`` steps; any other decision brings it back to every step. A scrape is not free: on 2
cores one a second cost vLLM CPU x0.94 of its tok/s (BENCHMARKS P7 A2), and the engine's counters
and gauges carry over the gap (tok/s is tokens over the seconds between two scrapes). The loop never
raises into the client: a failed step is logged and the targets stay where they were.

An endpoint whose engine the client was not told about (``unknown``) is asked once, before its first
item (:meth:`Steering.learn`, from the client's start check), what the engine publishes of its
capacity (:mod:`harvest.client.capacity`); its controller then starts there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from harvest.client.autoconc import AutoConcurrency, AutoSettings, Canary, Decision, Gauges
from harvest.client.canary import MIN_TARGET as CANARY_MIN_TARGET
from harvest.client.canary import CanaryRunner, Send
from harvest.client.capacity import ask_capacity
from harvest.client.endpoints import Endpoint, EndpointPool
from harvest.client.engine import EngineLimit
from harvest.client.every import Every
from harvest.client.records import EndpointState
from harvest.transport import Transport

log = logging.getLogger("harvest.client")

#: ``scrape(endpoint_url, timeout)`` -> metrics summed by name ({} when the engine has none).
Scrape = Callable[[str, float], Awaitable[Mapping[str, float]]]

#: The most steps between two scrapes of an endpoint settled with nothing to move soon.
QUIET_MAX = 8


@dataclass(frozen=True)
class Target:
    """The auto-concurrency target of one endpoint at one moment (for displays and status)."""

    url: str
    target: int
    phase: str
    reason: str
    tok_s: float | None
    #: True when the engine's /metrics fed the last step.
    gauges: bool
    #: Requests waiting in the engine's queue at the steering's last scrape (None: no gauges).
    queue: float | None = None
    #: Why the target is where it is, in words: where it started and why, or its last move and the
    #: measurement behind it ("engine capacity 4 from /props", "probing: 512 paid x1.9").
    why: str = ""


class Steering:
    """The controllers of one client's endpoints and the task that feeds them."""

    def __init__(self, pool: EndpointPool, settings: AutoSettings, scrape: Scrape,
                 clock: Callable[[], float], sleep: Callable[[float], Awaitable[object]],
                 rescrape_every: int = 15, canary: Send | None = None,
                 per_endpoint: Mapping[str, AutoSettings] | None = None,
                 unknown: Collection[str] = (), settings_for: Callable[[EngineLimit], AutoSettings] | None = None):
        """``settings``: every endpoint's knobs, but those in ``per_endpoint`` (by URL: a server
        launched with a batch limit of its own starts and stops there). ``unknown``: the URLs whose
        engine nobody described, asked by :meth:`learn`, and ``settings_for`` turns what one
        publishes into its knobs. The loop steps every ``settings.interval_s``."""
        self._pool = pool
        self.settings = settings
        self._scrape = scrape
        self._clock = clock
        self._rescrape_every = rescrape_every
        own = per_endpoint or {}
        self._controllers = {e.url: AutoConcurrency(own.get(e.url, settings)) for e in pool.endpoints}
        self._no_metrics: dict[str, int] = {}
        #: Endpoints scraped less often while settled: (steps left to skip, steps between scrapes).
        self._quiet: dict[str, tuple[int, int]] = {}
        self._canary = canary
        self._canaries: dict[str, CanaryRunner] = {}
        self._unknown = set(unknown) if settings_for is not None else set()
        self._settings_for = settings_for
        # Steering is an optimisation: a step that fails leaves the targets as they are, never the client.
        self._loop = Every(self.step, interval_s=settings.interval_s, sleep=sleep,
                           failed="auto concurrency step failed; targets unchanged")
        for endpoint in pool.endpoints:
            pool.set_limit(endpoint, self._controllers[endpoint.url].target)

    async def learn(self, url: str, transport: Transport, headers: Mapping[str, str], timeout: float) -> None:
        """Before the endpoint ``url``'s first item: ask what its engine publishes of its capacity
        and start its controller there (once; nothing for an engine whose batch was given)."""
        if url not in self._unknown or self._settings_for is None:
            return
        self._unknown.discard(url)
        limit = await ask_capacity(transport, headers, url, timeout)
        controller = self._controllers[url] = AutoConcurrency(self._settings_for(limit))
        endpoint = next(e for e in self._pool.endpoints if e.url == url)
        self._pool.set_limit(endpoint, controller.target)
        log.info("auto concurrency %s: starts at %d (%s)", url, controller.target, controller.why)

    def renamed(self, old: str, new: str) -> None:
        """An endpoint now points at another server (``Client.replace_endpoint``): its controller follows."""
        self._controllers[new] = self._controllers.pop(old)
        if old in self._no_metrics:
            self._no_metrics[new] = self._no_metrics.pop(old)
        if old in self._unknown:
            self._unknown = (self._unknown - {old}) | {new}
        self._quiet.pop(old, None)  # the new server is scraped at once
        self._canaries.pop(old, None)  # a canary of the old server says nothing of the new one

    def record(self, endpoint: Endpoint, completion_tokens: int | None, latency_s: float) -> None:
        """One answer from ``endpoint``."""
        self._controllers[endpoint.url].record(completion_tokens, latency_s)

    def targets(self) -> tuple[Target, ...]:
        """Each endpoint's current target and the last decision about it."""
        out = []
        for endpoint in self._pool.endpoints:
            controller = self._controllers[endpoint.url]
            last: Decision = controller.last
            seen = controller.seen
            queue = seen.waiting if seen is not None and last.gauges else None
            out.append(Target(endpoint.url, controller.target, last.phase, last.reason, last.tok_s,
                              last.gauges, queue, controller.why))
        return tuple(out)

    def ensure_started(self) -> None:
        """Start the steering task (from inside the event loop); a no-op once it runs."""
        self._loop.ensure_started()

    async def aclose(self) -> None:
        await self._loop.aclose()
        canaries, self._canaries = list(self._canaries.values()), {}
        await asyncio.gather(*(c.aclose() for c in canaries))

    async def step(self) -> None:
        """One round: scrape every healthy endpoint, step its controller, apply its target."""
        endpoints = [e for e in self._pool.endpoints if e.state is EndpointState.HEALTHY]
        for e in self._pool.endpoints:
            if e.state is not EndpointState.HEALTHY:
                self._quiet.pop(e.url, None)  # back healthy, it is scraped at once: it may have restarted
        gauges = await asyncio.gather(*(self._read(e) for e in endpoints))
        now = self._clock()
        for endpoint, reading in zip(endpoints, gauges):
            controller = self._controllers[endpoint.url]
            before = controller.target
            # Busy: the client held (nearly) its target on it at some moment of the step.
            busy = endpoint.peak >= 0.9 * before
            endpoint.peak = endpoint.outstanding
            runner = self._runner(endpoint, reading)
            canary = runner.poll(endpoint.url, now) if runner is not None else None
            last = controller.last
            decision = controller.step(now, reading, busy=busy, canary=canary, paced=runner is not None)
            if reading is not None:
                # The same settled decision again with nothing to move soon: scrape half as often.
                same = (decision.target, decision.phase, decision.reason) == \
                    (last.target, last.phase, last.reason)
                period = self._quiet.get(endpoint.url, (0, 1))[1]
                period = min(2 * period, QUIET_MAX) if same and controller.scrape_rests() else 1
                self._quiet[endpoint.url] = (period - 1, period)
            if decision.target != before:
                log.debug("auto concurrency %s: %d -> %d (%s, %s)", endpoint.url, before, decision.target,
                          decision.phase, decision.reason)
            # At the engine's batch limit a canary takes one of the target's places: sent on top of
            # a full engine it would wait for a place the level never asked for (and read as a
            # queue). Below it, it goes on top and the items keep the whole target.
            # A canary at rest (nothing to judge until a ceiling lifts) takes no place and none is sent.
            resting = runner is not None and not runner.going and controller.canary_rests()
            place = runner is not None and not resting and controller.canary_place()
            self._pool.set_limit(endpoint, max(1, decision.target - (1 if place else 0)))
            if runner is not None and not resting and decision.target == before and (
                    not place or endpoint.outstanding < decision.target):
                # Not in the step that moved the target: sent after the requests a new level lets
                # in, it waits behind them if the engine queues them.
                runner.start(endpoint.url, now, endpoint.outstanding)

    def _runner(self, endpoint: Endpoint, gauges: Gauges | None) -> CanaryRunner | None:
        """The canary of an endpoint with no /metrics (None: it has them, no canary is given, the
        endpoint does not stream one, or its target is too small to spare a place for one)."""
        if self._canary is None or gauges is not None or endpoint.url not in self._no_metrics \
                or self._controllers[endpoint.url].target < CANARY_MIN_TARGET:
            return None
        runner = self._canaries.get(endpoint.url)
        if runner is None:
            runner = self._canaries[endpoint.url] = CanaryRunner(self._canary)
        return None if runner.given_up else runner

    async def _read(self, endpoint: Endpoint) -> Gauges | None:
        left, period = self._quiet.get(endpoint.url, (0, 1))
        if left > 0:
            self._quiet[endpoint.url] = (left - 1, period)
            return None
        skipped = self._no_metrics.get(endpoint.url)
        if skipped is not None and skipped < self._rescrape_every:
            self._no_metrics[endpoint.url] = skipped + 1
            return None
        # A late reading is still a reading: vLLM CPU's HTTP server, swamped by a level's new
        # requests, answered /metrics in 2-5 s, and a 1 s bound left auto blind for 5-10 s at start.
        timeout = max(3 * self.settings.interval_s, 3.0)
        try:
            metrics = await asyncio.wait_for(self._scrape(endpoint.url, timeout), timeout + 1.0)
        except (asyncio.TimeoutError, Exception) as exc:  # a busy engine may answer /metrics late
            log.debug("auto concurrency: /metrics of %s not read this step: %r", endpoint.url, exc)
            return None
        gauges = Gauges.from_metrics(metrics)
        if gauges is None:
            self._no_metrics[endpoint.url] = 0
        else:
            self._no_metrics.pop(endpoint.url, None)
        return gauges


__all__ = ["Steering", "Target"]
