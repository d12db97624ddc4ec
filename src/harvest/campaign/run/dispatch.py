"""The dispatch loop: claim, send, collect, react; until nothing is left or the run must end.

:class:`Dispatch`, one per session (``campaign/run/session.py``), given the run's state, the intake
and the supervision. Pending items are claimed from the ledger oldest first, a little ahead of the
client's capacity, and sent from the claimed rows prefix-aware (``campaign/run/order.py``); each
result is committed exactly once through the single writer.

Who pays for a failure is decided by type: RequestError fails the item; ServerSick (every endpoint
down, or hung, past the client's health deadline) releases in-flight items back to pending uncharged
and, for a server harvest manages, relaunches it (``campaign/run/supervise.py``); so does a managed
server that died, or stayed hung past ``[client] hang_deadline`` (``harvest.client.hang``). When
``run.breaker_window`` requests in a row fail with the same class and message
(``campaign/run/breaker.py``), dispatch stops and those items and the ones in flight go back to
pending uncharged. An interrupt releases what is in flight; claimed rows never sent go back to
pending too. No request outlives the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harvest.campaign.run.batchrow import generate_rows
from harvest.campaign.run.breaker import Breaker
from harvest.campaign.run.context import ContextGuard
from harvest.campaign.run.generate import generate_samples, logprobs_to_ask
from harvest.campaign.run.intake import Intake
from harvest.campaign.run.order import PrefixOrder, prefix_key
from harvest.campaign.run.state import RunState
from harvest.campaign.run.supervise import Supervision
from harvest.campaign.outputs.progress import Progress
from harvest.campaign.outputs.timeline import RUNNING, WAITING, Timeline
from harvest.client import Client
from harvest.client.metrics import PrefixCacheMeter
from harvest.errors import RequestError, ServerSick
from harvest.ledger import Completion, Failure, LedgerWriter, Status
from harvest.ledger.records import Key

log = logging.getLogger("harvest.campaign")

#: Items claimed ahead of the client's concurrency, so the engine's queue never runs dry; the
#: claimed rows wait in a :class:`PrefixOrder`, the window in which prefix-sharing items are grouped.
CLAIM_FACTOR = 2
#: Requests started beyond the client's capacity: capacity // this (at least 2) wait in its queue.
SEND_HEADROOM = 8
#: What a dispatch step answers: end the run, or start the next turn at once.
_END, _AGAIN = object(), object()


@dataclass
class _Loop:
    """The state of one dispatch loop: the requests in flight (task -> item id), the claimed rows
    not sent yet, the finished requests' queue, and what the loop learnt."""

    tasks: dict[asyncio.Task[Any], Key]
    order: PrefixOrder = field(default_factory=PrefixOrder)
    #: Row key -> when the ledger handed it out, while it waits in ``order``.
    claimed_at: dict[Any, float] = field(default_factory=dict)
    #: The samples of an item go out as one request with ``n`` ([sampling] n, an engine that takes it).
    one_request: bool = False
    # Finished requests arrive here from their done callbacks: a loop turn costs O(answers), where
    # asyncio.wait(tasks) cost O(requests in flight) per answer (P6: x1.47 driver CPU per request
    # with 8 engines and 512 in flight, x0.97 with this queue).
    finished: asyncio.Queue[asyncio.Task[Any]] = field(default_factory=asyncio.Queue)
    exhausted: bool = False
    server_down: bool = False
    last_update: float = 0.0


class _Samples:
    """The samples of one item claimed together: generated once (``generate_samples``: one request
    with ``n`` where the engine takes it), handed to each sample's task by index. The shared work
    starts with the first task that asks and is cancelled when every task waiting on it is."""

    def __init__(self, start: Any):
        self._start = start
        self._task: asyncio.Future[Any] | None = None
        self._waiting = 0

    async def get(self, index: int) -> Any:
        if self._task is None or self._task.cancelled():  # (again, when every earlier waiter left)
            self._task = asyncio.ensure_future(self._start())
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved here
        self._waiting += 1
        try:
            found = await asyncio.shield(self._task)
        finally:
            self._waiting -= 1
            if self._waiting == 0 and not self._task.done():
                self._task.cancel()
        if isinstance(found[index], BaseException):
            raise found[index]
        return found[index]


def _by_item(rows: Sequence[Any]) -> list[list[Any]]:
    """Claimed rows grouped by item id, in claim order (an item's samples are consecutive rows)."""
    groups: dict[str, list[Any]] = {}
    for row in rows:
        groups.setdefault(row.id, []).append(row)
    return list(groups.values())


class Dispatch:
    """The dispatch loop of one session, given the run's state, the intake (is more coming?) and
    the supervision (relaunch a dead or hung server), with the writer, client and display of the
    session. It owns what only dispatch uses: the breaker, the context guard, the prefix-cache
    meter and the scrape beside the loop."""

    def __init__(self, state: RunState, intake: Intake, supervision: Supervision, *, writer: LedgerWriter,
                 client: Client, progress: Progress):
        self.state = state
        self.config = state.config
        self.intake = intake
        self.supervision = supervision
        self.writer = writer
        self.client = client
        self.progress = progress
        self.breaker = Breaker(self.config.run.breaker_window)
        self.context = ContextGuard(self.config)  # learns the model's context on its first check
        #: The engines' prefix-cache hit rate over this session, from the progress scrapes.
        self.prefix_cache = PrefixCacheMeter()
        self._scrape_task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Dispatch until nothing is left or the run must end; no request outlives it."""
        tasks: dict[asyncio.Task[Any], Key] = {}
        try:
            await self._dispatch(tasks)
        finally:
            if tasks:  # an error (e.g. a full disk) ended dispatch: no request may outlive it
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            scrape = self._scrape_task
            if scrape is not None and not scrape.done():
                scrape.cancel()
                await asyncio.gather(scrape, return_exceptions=True)
            # Dispatch is over: the server's last gauges no longer describe this run.
            self.progress.server, self.progress.server_endpoints = {"running": None, "waiting": None}, {}

    async def _dispatch(self, tasks: dict[asyncio.Task[Any], Key]) -> None:
        """Claim, send, collect, react; until nothing is left or the run must end. Each turn of the
        loop is one of each named step below; a step that ends the run says so with ``_END``."""
        d = _Loop(tasks, PrefixOrder(enabled=self.config.run.prefix_order))
        cfg, state, progress = self.config, self.state, self.progress
        d.one_request = cfg.sampling.one_request(cfg.server.engine if cfg.server else None)
        while True:
            await self._refill(d)
            if not tasks:
                if (not d.exhausted and not d.server_down and not state.stop_requested.is_set()
                        and self.intake.ingesting()):
                    await self.intake.wait_ingested(0.5)  # everything ingested so far is done: wait for more
                    continue
                break
            progress.in_flight = len(tasks) + len(d.order)  # claimed: sent, or waiting in harvest's queue
            d.server_down = await self._collect(d) or d.server_down
            verdict = await self._react(d)
            if verdict is _END:
                break
            if verdict is _AGAIN:
                continue
            self._tick(d)
        if state.stop_requested.is_set():
            state.end("interrupted")  # unless the run ended otherwise first
        held = d.order.drain()
        d.claimed_at.clear()
        if held:  # claimed, never sent: back to pending, uncharged
            await self.writer.release(held)
        self._commit_failures(self.breaker.finish())
        progress.in_flight = 0

    # The named steps of one dispatch turn.

    async def _refill(self, d: _Loop) -> None:
        """Claim up to ``CLAIM_FACTOR`` x the client's capacity (it moves with ``concurrency =
        "auto"``; deeper while the claimed rows share prefixes: ``PrefixOrder.depth``), then send
        from the claimed rows, prefix-aware (campaign/run/order.py), while the client has room for them
        plus a little headroom, so its own queue stays short and in our order."""
        client = self.client
        capacity = client.capacity()
        if self.state.stop_requested.is_set() or d.server_down:
            return
        want = d.order.depth(capacity * CLAIM_FACTOR) - len(d.tasks) - len(d.order)
        if not d.exhausted and want > 0:
            # Asked before the claim: an ingest that ended before it committed before it.
            ingesting = self.intake.ingesting()
            rows = await self.writer.claim(want)
            if not rows and not ingesting:
                d.exhausted = True
            now = time.monotonic()
            d.claimed_at.update((row.key, now) for row in rows)
            d.order.add(rows)
        room = capacity + max(2, capacity // SEND_HEADROOM) - len(d.tasks)
        batch = []
        while room > 0 and len(d.order):
            batch.append(d.order.pop())
            room -= 1
        cfg = self.config
        for group in _by_item(batch):  # the samples of one item sent together: one request
            item = group[0].item
            affinity = prefix_key(item) if cfg.client.prefix_affinity else None
            if item.request is not None:  # an OpenAI batch row: its own request, as the row asks
                samples = _Samples(functools.partial(generate_rows, client, item,
                                                     settings_hash=self.state.settings_hash, affinity=affinity))
            else:
                samples = _Samples(functools.partial(
                    generate_samples, client, item, [r.sample for r in group], run=cfg.run, sampling=cfg.sampling,
                    settings_hash=self.state.settings_hash, one_request=d.one_request, affinity=affinity,
                    logprobs_ask=logprobs_to_ask(cfg)))
            for index, row in enumerate(group):
                task = asyncio.create_task(self._one(row, samples, index, d.claimed_at.pop(row.key, None)))
                task.add_done_callback(d.finished.put_nowait)
                d.tasks[task] = row.key

    async def _one(self, row: Any, samples: _Samples, index: int, claimed_at: float | None = None) -> None:
        """Generate one sample of an item and commit its outcome (the writer keeps it exactly once).
        ``claimed_at``: when the ledger handed it out (its wait in the send order counts as queued)."""
        writer, progress = self.writer, self.progress
        row_id = row.key  # (id, sample): one ledger row per sample
        if await self.context.skipped(self.client, writer, progress, row_id, row.item):
            return  # its prompt cannot fit the model's context: never sent
        t0 = claimed_at or time.monotonic()  # claimed; the request waits for a slot in the client
        try:
            gen = await samples.get(index)
        except RequestError as exc:
            failure = Failure(row.id, str(exc), exc.error_class, row.sample)
            if self.breaker.holds(failure.error_class):  # committed once the streak ends
                self._commit_failures(self.breaker.failed(failure))
            else:
                self._commit_failures([*self.breaker.succeeded(), failure])
            return
        self._commit_failures(self.breaker.succeeded())
        for _ in range(gen.attempts):
            writer.charge_attempt(row_id)
        # Latency from each request being sent; the rest of the time since the claim is the
        # item's wait in harvest's own queue (claimed ahead, waiting for a slot).
        queued = max(time.monotonic() - t0 - gen.latency_s, 0.0)
        if gen.dropped is not None:
            writer.fail(Failure(row.id, gen.dropped, gen.drop_class, row.sample))
            progress.record(Status.FAILED.value, gen.prompt_tokens, gen.completion_tokens, gen.latency_s,
                            queued)
            progress.error(gen.drop_class)
            return
        writer.complete(Completion(row.id, gen.output, gen.status, gen.finish_reason, gen.prompt_tokens,
                                   gen.completion_tokens, sample=row.sample, logprobs=gen.logprobs))
        progress.record(gen.status.value, gen.prompt_tokens, gen.completion_tokens, gen.latency_s, queued)
        if gen.ttft_s is not None or gen.itl_s:
            progress.stream_times(gen.ttft_s, gen.tpot_s, gen.itl_s)

    async def _collect(self, d: _Loop) -> bool:
        """Take the requests that finished; release the items whose server stayed sick (True then)."""
        done = await self._finished(d.finished, 0.5)
        sick: list[Key] = []
        for task in done:
            row_id = d.tasks.pop(task, None)
            if row_id is None:
                continue  # cancelled and released above (a relaunch, an interrupt): already handled
            exc = task.exception()
            if isinstance(exc, ServerSick):
                sick.append(row_id)
                self.progress.error("server_sick")
            elif exc is not None:
                raise exc
        if sick:
            await self.writer.release(sick)
        return bool(sick)

    async def _react(self, d: _Loop) -> object:
        """What the turn's outcome asks for: ``_END`` the run (breaker, server down, interrupt),
        ``_AGAIN`` after a relaunch, else None."""
        tasks, state, supervision, client = d.tasks, self.state, self.supervision, self.client
        if self.breaker.trip is not None:
            # Every recent request failed the same way: the job, not the items, is wrong.
            await self._release_in_flight(tasks, [(f.item_id, f.sample) for _, f in self.breaker.held])
            state.tripped(self.breaker.trip)
            return _END
        if d.server_down and not tasks:
            # Every endpoint stayed down (or hung) past the client's health deadline.
            why = supervision.down_reason(client)
            if state.fleet is not None and await supervision.relaunch(f"{why}; relaunched"):
                await client.check_health()
                d.server_down, d.exhausted = False, False
                return _AGAIN
            state.hung = tuple(e.url for e in client.stats().endpoints if e.hung_s is not None)
            state.end("server_down", why)
            return _END
        if supervision.exited() and not d.server_down:
            # The managed server died: held requests wait for health; relaunch it now.
            code = state.fleet.returncode() if state.fleet is not None else None
            return await self._replace_server(d, f"the server exited (code {code}); relaunched",
                                              "the managed server exited and relaunches are used up")
        hung = None if d.server_down else supervision.hung(client)
        if hung is not None:
            # The managed server is hung past [client] hang_deadline: its requests will never come back.
            return await self._replace_server(d, f"{hung}; relaunched",
                                              f"the managed server is {hung}, and relaunches are used up")
        if state.stop_requested.is_set() and tasks:
            await self._release_in_flight(tasks)
            state.end("interrupted")
            return _END
        return None

    async def _replace_server(self, d: _Loop, why: str, used_up: str) -> object:
        """Release what is in flight (uncharged), then the verified stop and a fresh launch of the
        managed server: ``_AGAIN``, or ``_END`` when the relaunches are used up."""
        await self._release_in_flight(d.tasks)
        if not await self.supervision.relaunch(why):
            self.state.end("server_down", used_up)
            return _END
        await self.client.check_health()
        d.exhausted = False
        return _AGAIN

    def _tick(self, d: _Loop) -> None:
        """Every ``progress_interval``: a scrape beside dispatch, the targets, the display."""
        now = time.monotonic()
        if now - d.last_update < self.config.run.progress_interval:
            return
        d.last_update = now
        # The scrape runs beside dispatch: a server slow to answer /metrics while it
        # generates must not hold up the refill of its own queue. The display shows the
        # last scrape that finished.
        if self._scrape_task is None or self._scrape_task.done():
            self._scrape_task = asyncio.create_task(
                scrape(self.client, self.progress, self.prefix_cache, self.state.timeline))
        targets = self.client.concurrency_targets()
        self.progress.concurrency = {t.url: t.target for t in targets}
        self.progress.concurrency_reasons = {t.url: t.why for t in targets}
        self.progress.update()

    @staticmethod
    async def _finished(queue: asyncio.Queue[asyncio.Task[Any]], timeout: float) -> list[asyncio.Task[Any]]:
        """The requests that finished since the last call; waits up to ``timeout`` for the first."""
        done: list[asyncio.Task[Any]] = []
        if queue.empty():
            with contextlib.suppress(asyncio.TimeoutError):
                done.append(await asyncio.wait_for(queue.get(), timeout))
        while not queue.empty():
            done.append(queue.get_nowait())
        return done

    def _commit_failures(self, failures: list[Failure]) -> None:
        """Commit item failures (each charged one attempt), e.g. those the breaker held and let go."""
        for failure in failures:
            self.writer.charge_attempt((failure.item_id, failure.sample))
            self.writer.fail(failure)
            self.progress.error(failure.error_class)
            self.progress.record(Status.FAILED.value)

    async def _release_in_flight(self, tasks: dict[asyncio.Task[Any], Key], also: Sequence[Key] = ()) -> None:
        """Cancel the requests in flight and put their items (and ``also``) back to pending, uncharged."""
        ids = [*tasks.values(), *also]
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks.clear()
        await self.writer.release(ids)

    async def read_cache_counters(self, timeout: float = 10.0) -> None:
        """The engines' prefix-cache counters read while nothing runs: before the first request (the
        baseline the run's hit rate counts from) and after the last (what the run added). A busy
        engine may answer no /metrics scrape while it generates (vLLM's CPU build answered only once
        the run drained), so without these two the rate could rest on no reading at all."""
        try:
            metrics = await asyncio.wait_for(self.client.scrape_metrics(timeout=timeout), timeout=timeout + 5.0)
        except Exception:  # noqa: BLE001 - informative only: the scrapes during the run may still speak
            log.debug("prefix-cache counters not read", exc_info=True)
            return
        self.prefix_cache.observe(metrics)
        self.progress.prefix_cache = self.prefix_cache.snapshot()


async def scrape(client: Client, progress: Progress, meter: PrefixCacheMeter, timeline: Timeline | None) -> None:
    """The engines' running and waiting requests for the display, and the prefix cache's counters
    (into ``meter``; the timeline keeps the readings). An endpoint that did not answer within 2 s
    shows as unknown ("-"), not as its last reading."""
    try:
        metrics = await asyncio.wait_for(client.scrape_metrics(timeout=2.0), timeout=5.0)
    except Exception:  # noqa: BLE001 - metrics are informative only; what was read is now unknown
        log.debug("metrics not read for the display", exc_info=True)
        metrics = {url: {} for url in client.endpoints}
    if timeline is not None:
        timeline.observe_metrics(metrics)
    running = waiting = None
    per_endpoint: dict[str, dict[str, float | None]] = {}
    for url, values in metrics.items():
        mine: dict[str, float | None] = {
            key: sum(values[n] for n in names if n in values) if any(n in values for n in names) else None
            for key, names in (("running", RUNNING), ("waiting", WAITING))}
        if mine["running"] is not None:
            running = (running or 0) + mine["running"]
        if mine["waiting"] is not None:
            waiting = (waiting or 0) + mine["waiting"]
        per_endpoint[url] = mine
    progress.server = {"running": running, "waiting": waiting}
    progress.server_endpoints = per_endpoint
    meter.observe(metrics)
    progress.prefix_cache = meter.snapshot()


__all__ = ["CLAIM_FACTOR", "SEND_HEADROOM", "Dispatch", "scrape"]
