"""Sick endpoints: out of the rotation, their health polled until they answer or their deadline passes.

The client's request path says when an endpoint is sick (:mod:`harvest.client.core`: a refused
connection, a failure run, a failed health check); :class:`Health` takes it out of the rotation and
polls ``GET /health`` (``/v1/models`` where there is no ``/health``), each pause twice the one before
up to ``health_interval_cap``. An endpoint still sick ``health_deadline`` seconds after its failure
run began is DOWN, and the requests on the wire to it are abandoned (held by their callers). A polling task never raises into the client: one that fails marks its endpoint
DOWN, so no request waits on it forever. It never logs the API key (``redact``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from harvest.client import protocol, replies
from harvest.client.endpoints import Endpoint, EndpointPool, endpoint_url
from harvest.client.policy import RetryPolicy
from harvest.client.records import EndpointState
from harvest.transport import Transport, TransportError

log = logging.getLogger("harvest.client")


class Health:
    """The health of one client's endpoints: sickness, polling, recovery.

    ``closed``: whether the client is closing (no new polling then). ``clock`` / ``sleep``: the
    client's time seams."""

    def __init__(self, pool: EndpointPool, transport: Transport, headers: Mapping[str, str],
                 retry: RetryPolicy, deadline_s: float, *, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[object]], redact: Callable[[str], str],
                 closed: Callable[[], bool]):
        self._pool = pool
        self._transport = transport
        self._headers = headers
        self._retry = retry
        self._deadline_s = deadline_s
        self._clock, self._sleep = clock, sleep
        self._redact = redact
        self._closed = closed

    def make_sick(self, endpoint: Endpoint, reason: str) -> None:
        """Take ``endpoint`` out of the rotation and poll its health (a no-op if it is sick already)."""
        if endpoint.failing_since is None:
            endpoint.failing_since = self._clock()
        if self._pool.set_state(endpoint, EndpointState.SICK):
            log.warning("endpoint %s is sick, dispatch to it paused: %s", endpoint.url, reason)
            if not self._closed():
                endpoint.recovery = asyncio.get_running_loop().create_task(self.recover(endpoint))

    def revive(self, endpoint: Endpoint, *, reset: bool) -> None:
        """Back into the rotation; ``reset``: its failure run starts afresh (a restarted server)."""
        if reset:
            endpoint.answered()
        endpoint.seen_down = False
        endpoint.hung_s = None
        if self._pool.set_state(endpoint, EndpointState.HEALTHY):
            log.info("endpoint %s is healthy again, dispatch resumed", endpoint.url)

    def heard_from(self, endpoint: Endpoint) -> None:
        """An answer came from ``endpoint``: a HUNG one (:mod:`harvest.client.hang`) was not hung
        after all and goes back into rotation."""
        if endpoint.state is EndpointState.HUNG:
            self.revive(endpoint, reset=True)

    async def recover(self, endpoint: Endpoint) -> None:
        """Poll a sick endpoint's health until it answers (back in rotation) or its deadline passes (DOWN)."""
        interval = self._retry.health_interval
        try:
            while endpoint.state is EndpointState.SICK:
                since = endpoint.failing_since if endpoint.failing_since is not None else self._clock()
                remaining = since + self._deadline_s - self._clock()
                if remaining <= 0:
                    self._pool.set_state(endpoint, EndpointState.DOWN)
                    held = endpoint.abandon()  # a frozen server holds them open: no error would come
                    log.error("endpoint %s down: not healthy within %g s; last error: %s; %d requests on the "
                              "wire to it held, uncharged", endpoint.url, self._deadline_s, endpoint.last_error, held)
                    return
                await self._sleep(min(interval, remaining))
                interval = min(interval * 2, self._retry.health_interval_cap)
                if await self.probe(endpoint):
                    # After a real outage the restarted server starts afresh; if health was fine all
                    # along, the failure run and its deadline carry on, so a server that answers
                    # /health but fails every request still ends DOWN.
                    self.revive(endpoint, reset=endpoint.seen_down)
                    return
                endpoint.seen_down = True
        except asyncio.CancelledError:
            raise
        except Exception:  # never leave an endpoint sick forever with waiters on it
            log.exception("health polling of %s failed; marking it down", endpoint.url)
            self._pool.set_state(endpoint, EndpointState.DOWN)

    async def shared_probe(self, endpoint: Endpoint) -> bool:
        """One probe for all the requests that failed on this endpoint at about the same time."""
        task = endpoint.probe
        if task is None or task.done():
            task = endpoint.probe = asyncio.get_running_loop().create_task(self.probe(endpoint))
        return await asyncio.shield(task)

    async def probe(self, endpoint: Endpoint) -> bool:
        """True when ``GET /health`` (or ``/v1/models`` where /health does not exist) answers 2xx."""
        for path in ("/health", protocol.MODELS_PATH):
            try:
                response = await self._transport.request("GET", endpoint_url(endpoint.url, path),
                                                         headers=self._headers, timeout=self._retry.probe_timeout,
                                                         max_bytes=replies.PROBE_BYTES)
            except TransportError as exc:
                log.debug("health probe %s%s: %s", endpoint.url, path, self._redact(str(exc)))
                return False
            if 200 <= response.status < 300:
                return True
            if response.status not in (404, 405):
                return False
        return False

    async def aclose(self) -> None:
        """Stop every health poll and shared probe (waits 5 s at most for them to end)."""
        tasks = [t for e in self._pool.endpoints for t in (e.recovery, e.probe)
                 if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)


__all__ = ["Health"]
