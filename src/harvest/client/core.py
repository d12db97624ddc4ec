"""The async client that drives prompts through one or more OpenAI-compatible endpoints.

One :class:`Client` per process holds one long-lived HTTP session. Every request goes through the
same path: wait for a concurrency slot and a healthy endpoint (least outstanding requests), send,
then judge the outcome (with ``concurrency = "auto"`` the slot is per endpoint: each endpoint's
controller in ``steer`` / ``autoconc`` sets how many requests it may hold, and a request waits
only until *some* healthy endpoint has room):

    2xx with a completion             -> :class:`Completion`; the endpoint's failure run ends
    2xx that is no completion, an     -> charged attempt (the answer's fault, not the server's health);
      answer past its cap, one that      back off; retry; spent: RequestError of class bad_reply,
      is not valid HTTP                  oversized or protocol (``client/replies.py``)
    3xx                               -> :class:`RequestError` at once (class redirect): never followed
    other 4xx (not 408/409/425/429)   -> :class:`RequestError` at once, with the server's message
    408/409/425/429                   -> charged attempt; back off (Retry-After honoured); retry
    5xx, connection lost, timeout     -> the endpoint's failure run grows and its health is probed:
                                         healthy -> charged attempt, back off, retry;
                                         unhealthy, or the run reached ``sick_after`` -> the endpoint
                                         is SICK and the request is *held*, not charged (but a request
                                         on the wire at ``max_outages`` outages is a suspected server
                                         killer and fails with RequestError)
    connection refused                -> the endpoint is SICK; the request is held, not charged

A sick endpoint leaves the rotation while a background task polls ``GET /health`` (``/v1/models``
where there is no ``/health``). Held requests go to another healthy endpoint or wait for this one.
An endpoint that stays sick ``health_deadline`` seconds after its failure run began is DOWN; when
every endpoint is down, requests raise :class:`ServerSick`. Charged attempts beyond
``max_retries`` raise :class:`RequestError`. So the runner can tell "this item failed"
(RequestError) from "the server is gone" (ServerSick) by type alone.

This module never logs or raises the API key (server messages that echo it are redacted), never
retries a 4xx that belongs to the item, and never waits without a bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any  # JSON as sent and received (bodies, messages, overrides): the server owns its shape

from pydantic import SecretStr

from harvest.client import protocol, replies, streaming
from harvest.client.autoconc import GAUGE_NAMES, AutoSettings
from harvest.client.canary import TOKENS as CANARY_TOKENS
from harvest.client.canary import canary_body
from harvest.client.endpoints import Abandoned, Endpoint, EndpointPool, endpoint_url, normalize_url
from harvest.client.hang import Watchdog
from harvest.client.engine import EngineLimit, auto_settings, to_ask
from harvest.client.health import Health
from harvest.client.metrics import scrape_metrics
from harvest.client.policy import (
    ITEM_CLASSES,
    REPLY_KINDS,
    RetryPolicy,
    backoff_delay,
    classify_status,
    error_message,
    parse_retry_after,
    redact,
    redirect_message,
    transport_failure,
)
from harvest.client.records import ClientStats, Completion, EndpointState, FailureKind
from harvest.client.startcheck import Listing, StartCheck
from harvest.client.steer import Steering, Target
from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import RawResponse, TimedEvents, Transport, TransportError, Unreachable
from harvest.config import ClientConfig, HarvestConfig, SamplingConfig
from harvest.errors import HarvestError, RequestError, ServerSick
from harvest.redact import redact_text

log = logging.getLogger("harvest.client")



@functools.lru_cache(maxsize=64)
def _shown_url(url: str) -> str:
    """An endpoint's URL as its answers record it (redacted): worked out once per URL, not per answer."""
    return redact_text(url)


class _Verdict(enum.Enum):
    """Who pays for a failed exchange."""

    CHARGED = "charged"  # the item: an attempt of its max_retries budget
    HELD = "held"  # the server: it is sick (failure run, or found sick by another request)
    OUTAGE = "outage"  # the server: it was confirmed down (refused connection, failed health check)


class Client:
    """Async OpenAI-compatible client over one or more endpoints serving the same model.

    Use as ``async with Client([url], config, sampling, api_key=key) as client:`` and call
    :meth:`chat` / :meth:`complete` from as many tasks as you like; the client bounds concurrency.

    ``model``: the name sent in every request; None asks the first endpoint's ``/v1/models``
    (and sends no name if it lists none). ``transport``: the HTTP seam (default: aiohttp); the
    client owns it and closes it. ``auto``: the controller's knobs for ``concurrency = "auto"``
    (default: start and bound from the config; ``auto_start`` unset: ``batch_limit``, the engine's
    known batch, where ``engine_metrics`` says whether it has /metrics, see
    :func:`~harvest.client.autoconc.start_for`; ``limit_exact``: that batch is the engine's hard cap
    on every endpoint, so the target stops just above it). ``limits``: what harvest knows of the
    engine behind some endpoints (by URL), for servers launched with settings of their own (a
    ``[[hosts]]`` entry that overrides ``max_running_requests``); those endpoints start and stop at
    their own batch, the others at ``batch_limit``. ``clock`` / ``sleep``: time seams for tests.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        config: ClientConfig | None = None,
        sampling: SamplingConfig | None = None,
        *,
        api_key: SecretStr | str | None = None,
        model: str | None = None,
        transport: Transport | None = None,
        retry: RetryPolicy | None = None,
        auto: AutoSettings | None = None,
        batch_limit: int | None = None,
        limit_exact: bool = False,
        engine_metrics: bool = True,
        limits: Mapping[str, EngineLimit] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rng: random.Random | None = None,
    ):
        self.config = config or ClientConfig()
        self.sampling = sampling or SamplingConfig()
        self.retry = retry or RetryPolicy()
        self._pool = EndpointPool(endpoints)
        count = len(self._pool.endpoints)
        bound = self.config.fixed_or_max() * (count if self.config.auto else 1)
        self._transport: Transport = transport or AiohttpTransport(
            max_connections=bound + 2 * count,
            connect_timeout=min(10.0, self.config.request_timeout))
        self._secret = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._secret:
            self._headers["Authorization"] = f"Bearer {self._secret}"
        self._model = model
        self._model_known = model is not None
        self._model_lock = asyncio.Lock()
        self._base = protocol.base_body(self.sampling, model)
        self._clock, self._sleep = clock, sleep
        self._rng = rng or random.Random()
        self._slots = asyncio.Semaphore(bound)
        #: ``concurrency = "auto"``: the per-endpoint controllers that set each endpoint's limit.
        self._steer: Steering | None = None
        if self.config.auto:
            # an endpoint of [client] endpoints may be any engine: its batch is no hint of the canary's
            default = EngineLimit(batch_limit, limit_exact, engine_metrics, hint=not self.config.endpoints)
            settings = auto or auto_settings(default, self.config)
            own = {normalize_url(url): limit for url, limit in (limits or {}).items()}
            if stray := set(own) - {e.url for e in self._pool.endpoints}:
                raise ValueError(f"limits for URLs that are not endpoints: {', '.join(sorted(stray))}")
            per_endpoint = {url: auto_settings(limit, self.config, auto) for url, limit in own.items()}
            self._steer = Steering(self._pool, settings, self._scrape_gauges, clock, sleep, canary=self._send_canary,
                                   per_endpoint=per_endpoint, unknown=to_ask(self.endpoints, own, default, self.config),
                                   settings_for=lambda limit: auto_settings(limit, self.config, auto))
        self._health = Health(self._pool, self._transport, self._headers, self.retry,
                              self.config.health_deadline, clock=clock, sleep=sleep, redact=self._redact,
                              closed=lambda: self._closed)
        self._watchdog = Watchdog(self._pool, self._health, self._transport, self._headers,
                                  deadline_s=self.config.health_deadline, probe_timeout=self.retry.probe_timeout,
                                  sleep=asyncio.sleep,  # real time: quiet spells are measured on it
                                  floor_s=self.retry.hang_floor, interval_s=self.retry.hang_interval)
        #: The path of the last request sent: the canary speaks the same dialect (chat or completions).
        self._last_path = protocol.CHAT_PATH
        self._in_flight = self._held = self._completed = self._retries = 0
        self._errors: Counter[str] = Counter()
        self._closed = False

    @classmethod
    def from_config(cls, config: HarvestConfig, server_urls: Sequence[str] | None = None,
                    engines: Sequence[EngineLimit] | None = None, *, engine: EngineLimit | None = None,
                    **kwargs: Any) -> Client:  # kwargs: Client's own keywords, passed on
        """A client for the job's server (if any) plus ``[client] endpoints``, with its key and model.
        ``server_urls`` replaces the server's own URL (a far server reached through tunnels). What
        whoever launched the servers knows of their engines, for ``concurrency = "auto"``:
        ``engine``, the engine of the ``[server]`` settings (None: nothing known), and ``engines``,
        one per URL, where a server was launched with settings of its own (a ``[[hosts]]`` entry's
        own ``max_running_requests``): each endpoint's controller starts and stops at its own
        engine's batch."""
        urls: list[str] = []
        api_key = None
        model = None
        if config.server is not None:
            own = list(server_urls if server_urls is not None else [config.server.url])
            known = engine if engine is not None else EngineLimit(None)
            each = list(engines) if engines is not None else [known] * len(own)
            if len(each) != len(own):
                raise ValueError(f"{len(each)} engine limits for {len(own)} server URLs")
            urls.extend(own)
            api_key = config.server.api_key()
            model = config.server.requested_model
            kwargs.setdefault("batch_limit", known.batch)
            # Its cap bounds an endpoint only when that endpoint is one of its servers: each server's
            # own (``limits``); a [client] endpoint may be any engine.
            kwargs.setdefault("limit_exact", known.exact and not config.client.endpoints)
            kwargs.setdefault("engine_metrics", known.metrics)
            if config.client.endpoints or any(e != known for e in each):
                kwargs.setdefault("limits", dict(zip(own, each)))
        urls.extend(config.client.endpoints)
        kwargs.setdefault("api_key", api_key)
        kwargs.setdefault("model", model)
        return cls(urls, config.client, config.sampling, **kwargs)

    def __repr__(self) -> str:
        return f"Client(endpoints={[e.url for e in self._pool.endpoints]!r}, concurrency={self.config.concurrency!r})"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop health polling and close the HTTP session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._steer is not None:
                await self._steer.aclose()
            await self._watchdog.aclose()
            await self._health.aclose()
        finally:  # the session is closed whatever the tasks above did (a second Ctrl-C included)
            await self._transport.aclose()

    # ------------------------------------------------------------------ public requests

    async def chat(self, messages: Sequence[Mapping[str, Any]], *, timeout: float | None = None,
                   affinity: str | None = None, **overrides: Any) -> Completion:
        """One chat completion for ``messages``. ``overrides`` replace sampling fields for this request
        (None removes one); ``extra_body`` is merged at the top level (``prompt_logprobs``, ...).
        ``affinity``: a key (the prompt's prefix) whose requests go to the same endpoint while its
        load allows (see ``client/endpoints.py``); None: the least loaded endpoint.

        Raises RequestError when the item fails, ServerSick when every endpoint is down.
        """
        if not self._model_known:
            await self._discover_model()
        body = dict(self._base)
        body["messages"] = messages
        if overrides:
            protocol.apply_overrides(body, overrides)
        return await self._call(protocol.CHAT_PATH, body, timeout, replies.read_chat, affinity)

    async def complete(self, prompt: str | Sequence[int], *, timeout: float | None = None,
                       affinity: str | None = None, **overrides: Any) -> Completion:
        """One text completion for ``prompt`` (text or token ids); otherwise as :meth:`chat`."""
        if not self._model_known:
            await self._discover_model()
        body = dict(self._base)
        body["prompt"] = prompt
        if overrides:
            protocol.apply_overrides(body, overrides)
        return await self._call(protocol.COMPLETIONS_PATH, body, timeout, replies.read_text, affinity)

    def stats(self) -> ClientStats:
        """A snapshot of in-flight and held requests, retries, errors by kind, and every endpoint."""
        return ClientStats(in_flight=self._in_flight, held=self._held, completed=self._completed,
                           retries=self._retries, errors=dict(self._errors),
                           endpoints=self._pool.stats(time.monotonic(), self.retry.hang_floor))

    def capacity(self) -> int:
        """Requests the client sends at once now: the fixed concurrency, or the sum of the healthy
        endpoints' current targets under ``concurrency = "auto"`` (at least 1)."""
        if self._steer is None:
            return int(self.config.concurrency)
        return max(1, sum(e.limit or 0 for e in self._pool.endpoints if e.state is EndpointState.HEALTHY))

    def concurrency_targets(self) -> tuple[Target, ...]:
        """Each endpoint's auto-concurrency target and the controller's last decision; () when the
        concurrency is fixed."""
        return () if self._steer is None else self._steer.targets()

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(e.url for e in self._pool.endpoints)

    def replace_endpoint(self, old: str, new: str) -> None:
        """Point endpoint ``old`` at ``new``: a replacement server (on a Ray cluster, another node).
        The endpoint turns sick with a fresh health deadline; its held requests, and those still on
        the wire to the old server, wait uncharged until ``new`` answers its health probe."""
        old_url, new_url = normalize_url(old), normalize_url(new)
        endpoint = next((e for e in self._pool.endpoints if e.url == old_url), None)
        if endpoint is None:
            raise ValueError(f"no endpoint {old_url}")
        if new_url != old_url and any(e.url == new_url for e in self._pool.endpoints):
            raise ValueError(f"{new_url} is already an endpoint")
        endpoint.url = new_url
        if self._steer is not None:
            self._steer.renamed(old_url, new_url)
        endpoint.seen_down = True
        endpoint.failing_since = self._clock()
        if endpoint.state is not EndpointState.SICK:
            self._pool.set_state(endpoint, EndpointState.SICK)
        if not self._closed and (endpoint.recovery is None or endpoint.recovery.done()):
            endpoint.recovery = asyncio.get_running_loop().create_task(self._health.recover(endpoint))
        log.warning("endpoint %s now points at %s (a replacement server)", old_url, new_url)

    @property
    def model(self) -> str | None:
        """The model name sent with requests (None until discovered, or when the server lists none)."""
        return self._model

    async def scrape_metrics(self, timeout: float | None = None) -> dict[str, dict[str, float]]:
        """Each endpoint's ``/metrics`` summed by name (see :func:`scrape_metrics`), over this client's
        session, all endpoints at once, each within ``timeout`` (default: the probe timeout). An
        endpoint without metrics, unreadable right now or slower than that maps to {} (logged at
        debug): one slow server does not hold up, or blank, the others' readings."""
        async def one(url: str) -> dict[str, float]:
            try:
                return await self._scrape_one(url, timeout or self.retry.probe_timeout)
            except HarvestError as exc:
                log.debug("metrics of %s not read: %s", url, self._redact(str(exc)))
                return {}
        urls = [endpoint.url for endpoint in self._pool.endpoints]
        return dict(zip(urls, await asyncio.gather(*(one(url) for url in urls)), strict=True))

    async def side_request(self, method: str, path: str, body: Any = None, *,
                           timeout: float | None = None) -> tuple[int, Any] | None:
        """One request beside the generations (``GET /v1/models``, ``POST /tokenize``, ...) to the
        first endpoint, over this client's session and key: ``(HTTP status, the JSON body or None)``,
        or None when no answer came within ``timeout`` (default: the probe timeout). No retries, no
        concurrency slot, no effect on the endpoint's health."""
        url = endpoint_url(self._pool.endpoints[0].url, path)
        data = protocol.encode(body) if body is not None else None
        try:
            response = await self._transport.request(method, url, body=data, headers=self._headers,
                                                     timeout=timeout or self.retry.probe_timeout)
        except TransportError as exc:
            log.debug("%s %s: %s", method, url, self._redact(str(exc)))
            return None
        return response.status, replies.loads(response.body)

    async def _scrape_one(self, url: str, timeout: float) -> dict[str, float]:
        return await scrape_metrics(url, transport=self._transport, headers=self._headers, timeout=timeout)

    async def _scrape_gauges(self, url: str, timeout: float) -> dict[str, float]:
        """Only the lines the auto-concurrency controller reads, parsed."""
        return await scrape_metrics(url, transport=self._transport, headers=self._headers, timeout=timeout,
                                    only=GAUGE_NAMES)

    async def check_health(self) -> dict[str, bool]:
        """Probe every endpoint now; a DOWN or SICK endpoint that answers goes back into rotation."""
        results: dict[str, bool] = {}
        for endpoint in self._pool.endpoints:
            healthy = await self._health.probe(endpoint)
            results[endpoint.url] = healthy
            if healthy and endpoint.state is not EndpointState.HEALTHY:
                self._health.revive(endpoint, reset=True)
        return results

    # ------------------------------------------------------------------ the request path

    async def _call(self, path: str, body: dict[str, Any], timeout: float | None,
                    parse: Callable[..., Completion], affinity: str | None = None) -> Completion:
        try:  # streamed (client/streaming.py): the same answer, assembled from its events, timed
            data = protocol.encode(streaming.request_body(body, self.config.stream))
        except (TypeError, ValueError) as exc:
            raise RequestError(f"request body cannot be sent: {exc}") from None
        # what the answer may cost, from the request (client/replies.py): applied while it is read
        limits = replies.limits_for(body, self.config.reply_bytes_per_token, len(data))
        timeout = timeout or self.config.request_timeout
        self._last_path = path
        charged = outages = 0
        while True:
            endpoint = await self._acquire(affinity)
            response: RawResponse | None = None
            kind: FailureKind | None = None
            started = time.perf_counter()
            try:
                response = await endpoint.carry(streaming.post(self._transport, endpoint_url(endpoint.url, path),
                                                               data, self._headers, timeout, self.config.stream, limits))
            except Abandoned:  # its endpoint was given up while it waited there: held, not charged
                self._errors[FailureKind.ABANDONED.value] += 1
                continue
            except TransportError as exc:
                kind, detail = transport_failure(exc), replies.failure_text(exc, limits)
            finally:
                self._pool.release(endpoint)
                self._in_flight -= 1
                self._slots.release()

            status = None
            if response is not None:
                status = response.status
                endpoint.heard(time.monotonic(), time.perf_counter() - started if status < 400 else None)
                self._health.heard_from(endpoint)
                kind = classify_status(status)
                if kind is None:
                    try:
                        completion = parse(response, limits, endpoint=_shown_url(endpoint.url),
                                           latency_s=time.perf_counter() - started, attempts=charged + 1)
                    except replies.BadReply as exc:
                        kind, detail = FailureKind.BAD_RESPONSE, f"HTTP {status}, {exc}"
                    else:
                        endpoint.answered()
                        endpoint.completed += 1
                        self._completed += 1
                        if self._steer is not None:
                            self._steer.record(endpoint, completion.completion_tokens, completion.latency_s)
                        return completion
                elif kind is FailureKind.REJECTED or kind is FailureKind.REDIRECT:
                    endpoint.answered()
                    self._errors[kind.value] += 1
                    said = (error_message(status, response.body) if kind is FailureKind.REJECTED
                            else redirect_message(status, response.location))
                    raise RequestError(self._redact(said), status=status, error_class=ITEM_CLASSES.get(kind))
                else:
                    detail = f"HTTP {status}: {error_message(status, response.body)}"

            assert kind is not None
            detail = self._redact(detail)
            self._errors[kind.value] += 1
            verdict = await self._charge(endpoint, kind, detail, status)
            if verdict is not _Verdict.CHARGED:
                if verdict is _Verdict.OUTAGE and kind is not FailureKind.UNREACHABLE:
                    outages += 1
                    if outages >= self.retry.max_outages:
                        raise RequestError(f"{detail} (the server went down {outages} times while this request "
                                           f"was in flight; suspected of crashing it)", status=status)
                continue  # held: the server is sick, the item is not charged; wait for health
            charged += 1
            if charged > self.config.max_retries:
                raise RequestError(f"{detail} (gave up after {charged} attempts)", status=status,
                                   error_class=ITEM_CLASSES.get(kind))
            self._retries += 1
            delay = backoff_delay(charged, base=self.retry.backoff_base, cap=self.retry.backoff_cap, rng=self._rng)
            if response is not None:
                retry_after = parse_retry_after(response.retry_after)
                if retry_after is not None:
                    delay = max(delay, retry_after)
            log.debug("retry %d of a request to %s in %.2f s: %s", charged, endpoint.url, delay, detail)
            await self._sleep(delay)

    async def _send_canary(self, url: str, arrivals: list[float]) -> TimedEvents:
        """One canary to ``url`` (see :mod:`harvest.client.canary`): not an item, never retried."""
        body = canary_body(self._model, CANARY_TOKENS, chat=self._last_path == protocol.CHAT_PATH)
        return await self._transport.timed_events(endpoint_url(url, self._last_path), body=body, headers=self._headers,
                                                  timeout=min(60.0, self.config.request_timeout), arrivals=arrivals)

    async def _acquire(self, affinity: str | None = None) -> Endpoint:
        """A concurrency slot and a healthy endpoint (``affinity``: see :meth:`chat`), its outstanding
        count taken; waits while none is."""
        deadline = None
        if self._steer is not None:
            self._steer.ensure_started()
        self._watchdog.ensure_started()
        while True:
            await self._slots.acquire()
            endpoint = self._pool.choose(affinity)
            if endpoint is not None:
                endpoint.took(time.monotonic())
                self._in_flight += 1
                return endpoint
            self._slots.release()
            if self._closed:
                raise RuntimeError("client is closed")
            if self._steer is not None and self._pool.any_healthy():
                # Every healthy endpoint holds its target: wait for one of them to have room, so a
                # slow endpoint's queue never holds up the fast ones (the wait is bounded; then retry).
                await self._pool.wait_room(self.config.request_timeout)
                continue
            if self._pool.all_down():
                raise self._sick_error()
            # The recovery tasks end every sickness within the health deadline; this bound only
            # guards against one of them having died.
            bound = self.config.health_deadline + 2 * self.retry.probe_timeout + 5.0
            now = time.monotonic()
            deadline = deadline or now + bound
            if now >= deadline:
                raise self._sick_error(f"no endpoint became healthy within {bound:.0f} s")
            self._held += 1
            try:
                await self._pool.wait_changed(deadline - now)
            finally:
                self._held -= 1

    async def _charge(self, endpoint: Endpoint, kind: FailureKind, detail: str, status: int | None) -> _Verdict:
        """Record a failure and say who pays: the item (CHARGED) or the sick server (HELD / OUTAGE)."""
        if kind in REPLY_KINDS:  # the answer's fault, not the server's health
            return _Verdict.CHARGED
        if endpoint.state is EndpointState.HEALTHY:
            endpoint.failed(self._clock(), detail, status)
            if kind is FailureKind.UNREACHABLE:
                endpoint.seen_down = True
                self._health.make_sick(endpoint, detail)
            elif endpoint.run >= self.retry.sick_after:
                self._health.make_sick(endpoint, f"{endpoint.run} failures in a row, last: {detail}")
            else:
                healthy = await self._health.shared_probe(endpoint)
                if endpoint.state is EndpointState.HEALTHY:
                    if healthy:
                        return _Verdict.CHARGED
                    endpoint.seen_down = True
                    self._health.make_sick(endpoint, f"health check failed after: {detail}")
        # else another request already found it sick
        return _Verdict.OUTAGE if endpoint.seen_down else _Verdict.HELD

    async def start_check(self, model: str | None, deadline_s: float,
                          on_wait: Callable[[str, float, str], None] | None = None) -> list[Listing]:
        """What each endpoint serves, asked before any item (:mod:`harvest.client.startcheck`): its
        model list, or, where it cannot list them, whether it is up and what a one-token request for
        ``model`` answered; under auto, what an engine not described publishes of its capacity
        (:meth:`Steering.learn`). Within ``deadline_s`` for all together; ``on_wait(url, waited_s,
        what_came_back)`` while one does not answer yet. Health states stay as they were."""
        check = StartCheck(self._transport, self._headers, probe_timeout=self.retry.probe_timeout,
                           clock=self._clock, sleep=self._sleep)
        start, out = self._clock(), []
        for endpoint in self._pool.endpoints:
            left = max(0.0, deadline_s - (self._clock() - start))
            listing = await check.endpoint(endpoint.url, model, left, on_wait)
            if self._steer is not None and listing.up:
                await self._steer.learn(endpoint.url, self._transport, self._headers, self.retry.probe_timeout)
            out.append(dataclasses.replace(listing, models_answer=self._redact(listing.models_answer))
                       if listing.models_answer else listing)
        return out

    def use_model(self, model: str) -> None:
        """Send ``model`` with every request from now on (the name checked against /v1/models)."""
        self._model, self._model_known = model, True
        self._base = protocol.base_body(self.sampling, model)

    async def _discover_model(self) -> None:
        """Learn the model name from ``/v1/models`` once; a refused connection waits for health."""
        async with self._model_lock:
            while not self._model_known:
                endpoint = await self._acquire()
                try:
                    response = await self._transport.request(
                        "GET", endpoint_url(endpoint.url, protocol.MODELS_PATH), headers=self._headers,
                        timeout=self.retry.probe_timeout)
                except Unreachable as exc:
                    detail = self._redact(str(exc))
                    self._errors[FailureKind.UNREACHABLE.value] += 1
                    if endpoint.state is EndpointState.HEALTHY:
                        endpoint.failed(self._clock(), detail, None)
                        endpoint.seen_down = True
                        self._health.make_sick(endpoint, detail)
                    continue
                except TransportError:
                    response = None
                finally:
                    self._pool.release(endpoint)
                    self._in_flight -= 1
                    self._slots.release()
                model = None
                if response is not None and 200 <= response.status < 300:
                    model = replies.first_model_id(response.body)
                self._model, self._model_known = model, True
                self._base = protocol.base_body(self.sampling, model)
                if model is None:
                    log.warning("%s lists no model; requests are sent without a model name", endpoint.url)

    # ------------------------------------------------------------------ errors

    def _redact(self, text: str) -> str:
        return redact(text, self._secret)

    def _sick_error(self, why: str | None = None) -> ServerSick:
        endpoints = self._pool.endpoints
        last = next((e for e in endpoints if e.last_error), None)
        message = why or f"not healthy within the health deadline of {self.config.health_deadline:g} s"
        if last is not None:
            message += f"; last error: {last.last_error}"
        statuses = [e.last_status for e in endpoints if e.last_status is not None]
        return ServerSick(self._redact(message), endpoint=", ".join(redact_text(e.url) for e in endpoints),
                          status=statuses[-1] if statuses else None)


__all__ = ["Client"]
