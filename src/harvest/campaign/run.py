"""The campaign: dataset -> ledger -> server(s) -> results, lossless and resumable.

    report = await run_campaign(config)

Order of work: open the ledger (refusing settings that change outputs unless ``allow_mixed``),
ingest the dataset's first batch (so that a dataset that cannot be read fails before any launch),
launch the server when the job names one to launch (a server a killed earlier session left
running is stopped first, by its record; then preflight -> launch -> ready) while the rest of the
dataset is ingested batch by batch beside it, dispatch pending items through the client as soon
as they are in the ledger (claimed oldest first, sent prefix-aware: campaign/order.py), commit
each result exactly once through the single writer, then the
verified stop and the totals check ``done + truncated + failed + skipped == unique input``. An
interrupted ingest resumes by position, passing over what it committed without normalizing it.

Who pays for a failure is decided by type: RequestError fails the item; ServerSick (every endpoint
down past the client's health deadline) releases in-flight items back to pending uncharged and, for
a server harvest manages, relaunches it (at most ``run.max_relaunches`` times). When
``run.breaker_window`` requests in a row fail with the same class and message (campaign/breaker.py),
the job is at fault: dispatch stops, those items and the ones in flight go back to pending
uncharged, and the outcome is "stopped". ``retry`` puts failed or truncated items back to pending
first (recorded in the ledger), under the same settings-hash rule as any resume. Ctrl-C or SIGTERM
stops dispatch, releases what is in flight, commits what finished and stops the server: the run
resumes where it was. This module never kills a process itself: the supervisor does, by its record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harvest.campaign.breaker import Breaker, Trip
from harvest.campaign.context import ContextGuard
from harvest.campaign.folder import other_job, resume_line, skipped_problem
from harvest.campaign.distill import check_logprob_space, describe_samples
from harvest.campaign.generate import generate_samples
from harvest.campaign.order import PrefixOrder, prefix_key
from harvest.campaign.progress import Progress
from harvest.campaign.timeline import Timeline
from harvest.client import Client
from harvest.client.metrics import PrefixCacheMeter
from harvest.config import HarvestConfig
from harvest.dataset import iter_items
from harvest.dataset.skips import SkipReason, describe_skips, shape_settings
from harvest.errors import ConfigError, LedgerError, RequestError, ServerSick
from harvest.events import Event
from harvest.ledger import (
    Completion,
    Failure,
    IngestBatch,
    IngestReport,
    Ledger,
    LedgerWriter,
    Status,
    Totals,
    hash_settings,
    prepare_ingest,
)
from harvest.placement import from_config
from harvest.redact import escape_controls, redact_argv
from harvest.server import StopReport

log = logging.getLogger("harvest.campaign")

#: Items claimed ahead of the client's concurrency, so the engine's queue never runs dry; the
#: claimed rows wait in a :class:`PrefixOrder`, the window in which prefix-sharing items are grouped.
CLAIM_FACTOR = 2
#: Requests started beyond the client's capacity: capacity // this (at least 2) wait in its queue.
SEND_HEADROOM = 8
#: What a dispatch step answers: end the run, or start the next turn at once.
_END, _AGAIN = object(), object()
SERVER_DIR = "server"
#: Input records per ingest transaction.
INGEST_BATCH = 10_000
#: Longest wait for the background ingest to finish its current batch once asked to stop.
INGEST_STOP_TIMEOUT = 60.0


@dataclass
class _Dispatch:
    """The state of one dispatch loop: the requests in flight (task -> item id), the claimed rows
    not sent yet, the finished requests' queue, and what the loop learnt."""

    tasks: dict[asyncio.Task[Any], str]
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


@dataclass(frozen=True)
class RunReport:
    """How one ``harvest run`` session ended."""

    run_dir: Path
    totals: Totals
    #: Items that reached a final status in this session.
    finished_this_session: int
    elapsed_s: float
    #: "finished", "interrupted" (Ctrl-C / SIGTERM), "server_down" or "stopped" (the breaker).
    outcome: str
    relaunches: int = 0
    stop_reports: tuple[StopReport, ...] = ()
    recovered: int = 0
    note: str | None = None
    #: Why the circuit breaker stopped the run (outcome "stopped"), else None.
    trip: Trip | None = None
    #: Items ``--retry`` put back to pending at the start of this session.
    requeued: int = 0
    #: Why rows were skipped (all sessions), most frequent first.
    skip_reasons: tuple[SkipReason, ...] = ()
    #: Set when every row, or more than ``[data] max_skipped_share`` of them, was skipped.
    skip_problem: str | None = None
    #: What the session found in the run folder when it began (None: a new run).
    resumed: str | None = None

    @property
    def ok(self) -> bool:
        """The run finished, every unique input item is accounted for, and not too many were skipped."""
        return self.outcome == "finished" and self.totals.ok and self.skip_problem is None


def output_settings(config: HarvestConfig) -> dict[str, Any]:
    """The settings that change what the model writes: their hash guards a resume."""
    server = config.server
    return {
        "model": server.served_model_name or server.model if server else None,
        "engine": server.engine if server else None,
        "kv_cache_dtype": server.kv_cache_dtype if server else None,
        "dtype": server.dtype if server else None,
        "extra_args": list(redact_argv(server.extra_args)) if server else [],  # a secret is no setting
        "sampling": _sampling_settings(config),
        "history": config.run.history,
        "reasoning": config.run.reasoning,
        "truncated": [config.run.truncated, config.run.retry_max_tokens],
        "system_prompt": config.data.system_prompt if config.data else None,
    }


def _sampling_settings(config: HarvestConfig) -> dict[str, Any]:
    """``[sampling]`` as hashed: ``n`` and ``logprobs`` only when set (a run begun before they
    existed resumes under the same hash); ``n_per_request`` never (it changes no output)."""
    out = config.sampling.model_dump(mode="json", exclude={"n_per_request"})
    for key, default in (("n", 1), ("logprobs", 0)):
        if out.get(key) == default:
            out.pop(key)
    return out


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


def dataset_fingerprint(path: str) -> str:
    """Size plus a hash of the first and last MiB of every file: cheap, catches edits and swaps."""
    p = Path(path)
    files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}:{size};".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read())
    return h.hexdigest()


def describe_ids(data: Any, report: IngestReport) -> str:
    """Where the items' ids come from, for the input line: the user's field, content hashes, or both."""
    usable = report.total_rows - report.skipped
    field = data.id_field if data is not None and data.id_field else "id"
    if data is not None and data.id_field == "":
        return "ids: content hashes (id_field = \"\")"
    if report.own_ids == 0:
        return f"ids: content hashes (no {field!r} field)"
    if report.own_ids >= usable:
        return f"ids: the rows' {field!r} field"
    return (f"ids: the rows' {field!r} field ({report.own_ids}), content hashes where a row has none "
            f"({usable - report.own_ids})")


def _by_item(rows: Sequence[Any]) -> list[list[Any]]:
    """Claimed rows grouped by item id, in claim order (an item's samples are consecutive rows)."""
    groups: dict[str, list[Any]] = {}
    for row in rows:
        groups.setdefault(row.id, []).append(row)
    return list(groups.values())


class _Campaign:
    """One session of a run. Not reusable."""

    def __init__(self, config: HarvestConfig, *, allow_mixed: bool, force: bool, live: bool | None,
                 server_factory: Any = None, on_preflight: Any = None, retry: tuple[str, ...] = (),
                 console: Any = None, placement: Any = None):
        if config.data is None:
            raise ConfigError(config.source, [(f"{config.source} [data]", "`harvest run` needs a [data] table")])
        if config.server is None and not config.client.endpoints:
            raise ConfigError(config.source, [(f"{config.source} [server]",
                                               "`harvest run` needs a [server] table or [client] endpoints")])
        self.config = config
        self.run_dir = Path(config.output.dir)
        self.allow_mixed = allow_mixed
        self.force = force
        self.live = live
        #: Where the servers run (harvest.placement), chosen once; it makes them (server_factory).
        self.placement = placement if placement is not None else from_config(config)
        self.server_factory = server_factory if server_factory is not None else self.placement.fleet()
        self.on_preflight = on_preflight
        self.console = console  # the display's console (lines printed through it go above the panel)
        self.on_event: Any = None  # the display's phase listener, once it exists (harvest.events)
        self.settings_hash = hash_settings(output_settings(config))
        self.context = ContextGuard(config)  # learns the model's context on its first check
        self.stop_requested = asyncio.Event()
        self.server: Any = None  # a placement Fleet (or what a test's server_factory makes)
        self.stop_reports: list[StopReport] = []
        self.relaunches = 0
        self.outcome = "finished"
        self.note: str | None = None
        self.breaker = Breaker(config.run.breaker_window)
        #: The engines' prefix-cache hit rate over this session, from the progress scrapes.
        self.prefix_cache = PrefixCacheMeter()
        self.retry = retry
        self.requeued = 0
        # The background ingest: its records, task, a wake-up per committed batch, and its stop.
        self._records: Any = None
        self._ingest_task: asyncio.Task[None] | None = None
        self._ingested = asyncio.Event()
        self._ingest_stop = False
        #: The report's record of this session (timeline.json): intervals, histograms, launches.
        self.timeline: Timeline | None = None
        self._first_rows: int | None = None  # input rows read before the display started (this session)
        self._first_batch = (0, 0)  # rows of this session's first ingest batch, and how many were skipped
        #: (error class, reason) -> rows skipped by this session's ingest, for the input line.
        self._skip_reasons: dict[tuple[str, str], int] = {}
        self.resumed: str | None = None
        #: The model name sent with every request (checked against /v1/models), once known.
        self.model: str | None = None
        self._space: Any = None  # the logprob disk check of this session (campaign/distill.py)

    # --- ledger and dataset --------------------------------------------------------------------

    def open_ledger(self) -> Ledger:
        data = self.config.data
        assert data is not None
        if not self.allow_mixed:
            try:
                now_fingerprint: str | None = dataset_fingerprint(data.path)
            except OSError:
                now_fingerprint = None  # said below, once the folder is open
            foreign = other_job(self.run_dir, output_settings(self.config), data.path, now_fingerprint)
            if foreign is not None:
                raise LedgerError(foreign)
        meta = {"job": self.config.recorded(), "job_file": self.config.source,
                "output_settings": output_settings(self.config)}
        ledger = Ledger.open(self.run_dir, settings_hash=self.settings_hash, meta=meta,
                             allow_mixed=self.allow_mixed, samples=self.config.sampling.n)
        try:
            fingerprint = dataset_fingerprint(data.path)
        except OSError as exc:
            ledger.close()
            raise ConfigError(self.config.source, [(f"{self.config.source} [data] path",
                                                    f"cannot read {data.path}: {exc.strerror or exc}")]) from None
        known = ledger.meta().get("dataset_fingerprint")
        if known is not None and known != fingerprint and not self.allow_mixed:
            ledger.close()
            raise LedgerError(f"{data.path} changed since this run ingested it (its size, or its first or last "
                              f"MiB, differ); resuming would mix inputs. Use a new output dir, or "
                              f"--allow-mixed to accept it")
        ledger.set_meta("dataset_fingerprint", fingerprint)
        self._reread_skipped(ledger)
        if (line := describe_samples(self.config)) is not None:
            log.info("sampling: %s", line)
        for what in self.retry:  # after open: settings that change outputs were checked there
            count = ledger.requeue(what, reason=f"harvest run --retry {what}")
            log.info("--retry %s: %d items back to pending", what, count)
            self.requeued += count
        state = ledger.ingest_state()
        if not state["complete"]:
            # The first batch now, before any launch: a dataset that cannot be read fails here.
            self._records = iter_items(data, skip=state["rows"])
            try:
                first = prepare_ingest(self._records, INGEST_BATCH, self.config.sampling.n)
                self._count_skips(first)
                self._first_batch = (first.rows, first.skipped)
                report = ledger.commit_ingest(first, resumed_from=state["rows"])
                self._first_rows = report.total_rows
                self._space = check_logprob_space(self.config, ledger, first, report, force=self.force)
            except BaseException:
                self._close_records()
                ledger.close()
                raise
            if state["rows"]:
                log.info("ingest resumed after row %d", state["rows"])
            if report.complete:
                self._close_records()
                self._log_input(report)
        return ledger

    def _reread_skipped(self, ledger: Ledger) -> None:
        """Rows skipped at ingest are read again from the source when the [data] settings that
        decide a row's shape changed since they were read, or on ``--retry skipped``."""
        data = self.config.data
        assert data is not None
        shape = shape_settings(data)
        known = ledger.meta().get("data_shape")
        changed = known is not None and known != shape
        if (changed or "skipped" in self.retry) and ledger.counts()[Status.SKIPPED]:
            why = ("[data] " + ", ".join(f"{k} {known.get(k)!r} -> {v!r}" for k, v in shape.items()
                                         if known.get(k) != v)) if changed else "--retry skipped"
            rows = ledger.ingest_state()["rows"]
            records = iter_items(data)
            try:
                recovered, still = ledger.reread_skipped(itertools.islice(records, rows),
                                                         ("shape", "input"), reason=why)
            finally:
                with contextlib.suppress(ValueError):
                    records.close()  # type: ignore[attr-defined]
            log.info("skipped rows read again (%s): %d now items to generate, %d still skipped",
                     why, recovered, still)
            self.requeued += recovered
        ledger.set_meta("data_shape", shape)

    def _log_input(self, report: IngestReport) -> None:
        conflicts = ""
        if report.duplicates:  # a reader of its own: the writer thread may hold the run's connection
            with contextlib.suppress(LedgerError):
                ro = Ledger.open_readonly(self.run_dir)
                try:
                    n = ro.id_conflicts()
                    ids = ro.conflicting_ids() if n else []
                finally:
                    ro.close()
                if n:
                    shown = ", ".join(f"'{escape_controls(i, one_line=True)}'" for i in ids)
                    conflicts = (f" ({n} of them id conflicts: same id, different content; the first row "
                                 f"with the id is kept: {shown}{', ...' if n > len(ids) else ''})")
        log.info("input: %d rows, %d unique, %d duplicates%s, %d skipped; %s", report.total_rows, report.unique,
                 report.duplicates, conflicts, report.skipped, describe_ids(self.config.data, report))
        if self._skip_reasons:
            reasons = sorted((SkipReason(c, r, n) for (c, r), n in self._skip_reasons.items()),
                             key=lambda r: -r.count)
            for line in describe_skips(reasons):
                log.warning("  %s", line)

    def _first_batch_all_skipped(self, counts: dict[Status, int]) -> bool:
        """True when this session's first ingest batch was a whole batch, every row of it skipped,
        the dataset goes on, and nothing in the ledger waits to be generated."""
        rows, skipped = self._first_batch
        return (self._records is not None and rows >= INGEST_BATCH and skipped == rows
                and not counts[Status.PENDING] and not counts[Status.RUNNING])

    def _count_skips(self, batch: IngestBatch) -> None:
        for key, n in batch.skip_reasons.items():
            self._skip_reasons[key] = self._skip_reasons.get(key, 0) + n

    def _close_records(self) -> None:
        if self._records is not None:
            with contextlib.suppress(ValueError):  # still being read by a batch left to finish
                self._records.close()
            self._records = None

    async def _ingest_rest(self, writer: LedgerWriter, progress: Progress) -> None:
        """Ingest the rest of the dataset beside the launch and the dispatch, one batch per
        transaction through the writer; records are read and normalized on a worker thread."""
        records = self._records
        try:
            while not self._ingest_stop:
                batch: IngestBatch = await asyncio.to_thread(prepare_ingest, records, INGEST_BATCH,
                                                             self.config.sampling.n)
                if self._ingest_stop:
                    return  # not committed: the next session reads it again
                self._count_skips(batch)
                report = await writer.ingest(batch)
                progress.rows_read = report.total_rows
                progress.total = report.unique * self.config.sampling.n  # rows: one per sample
                progress.already_final += report.new_skipped * self.config.sampling.n  # final without any work
                self._ingested.set()
                if report.complete:
                    self._log_input(report)
                    progress.ingesting = False
                    return
        finally:
            self._close_records()
            self._ingested.set()

    def _ingesting(self) -> bool:
        """True while the background ingest may still add items; raises what ended it, if anything did."""
        task = self._ingest_task
        if task is None:
            return False
        if not task.done():
            return True
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return False

    async def _wait_ingested(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the next committed ingest batch (or the ingest's end)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._ingested.wait(), timeout)
        self._ingested.clear()

    async def _finish_ingest(self) -> None:
        """Let the background ingest finish its current batch and stop (it resumes next session)."""
        task = self._ingest_task
        if task is None:
            return
        self._ingest_stop = True
        try:
            await asyncio.wait_for(asyncio.shield(task), INGEST_STOP_TIMEOUT)
        except asyncio.TimeoutError:
            log.warning("the ingest did not finish its batch within %.0f s; it resumes next time",
                        INGEST_STOP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - dispatch raises it where it looks; here it only ends
            log.warning("the ingest stopped: %s", exc)

    # --- server -------------------------------------------------------------------------------

    async def start_server(self) -> None:
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        server = self.server_factory(cfg, run_dir=self.run_dir / SERVER_DIR, preflight=self.config.preflight,
                                     force=self.force, on_preflight=self.on_preflight, on_event=self.on_event)
        self.server = server
        await server.start()
        if self.timeline is not None:
            self.timeline.launch(server)

    def stop_leftover(self) -> None:
        """Stop, by their records, servers an earlier session of this run left running (that
        session was killed before its own stop). The ledger's lock proves that session is gone."""
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        for report in self.placement.leftovers(self.run_dir / SERVER_DIR):
            self.stop_reports.append(report)
            if self.timeline is not None:
                self.timeline.stop(report, leftover=True)

    async def stop_server(self) -> None:
        if self.server is None:
            return
        got = await self.server.stop()
        self.server = None
        for report in got if isinstance(got, list) else [got] if got is not None else []:
            self.stop_reports.append(report)  # one verified report per server, wherever it ran
            if self.timeline is not None:
                self.timeline.stop(report)

    def server_exited(self) -> bool:
        return self.server is not None and self.server.returncode() is not None

    async def relaunch(self) -> bool:
        """Verified stop of the dead server, then a fresh launch. False when out of relaunches: one
        budget for the run, shared with the replacements a placement made itself (Ray's)."""
        spent = self.relaunches + (getattr(self.server, "replacements", 0) if self.server is not None else 0)
        if self.server is None or spent >= self.config.run.max_relaunches:
            if self.server is not None and spent > self.relaunches:
                log.error("no relaunch: run.max_relaunches (%d) used up (%d by replacements)",
                          self.config.run.max_relaunches, spent - self.relaunches)
            return False
        self.relaunches += 1
        log.warning("the server exited (code %s); relaunch %d of %d", self.server.returncode(), self.relaunches,
                    self.config.run.max_relaunches)
        await self.stop_server()
        await self.start_server()
        return True

    async def _check_endpoints(self, client: Client, progress: Progress) -> bool:
        """Ask every endpoint's ``/v1/models`` (an endpoint harvest does not manage gets ``[client]
        start_deadline`` to answer) and send the configured model: one not listed is refused with
        the list. False (outcome "server_down") when an endpoint never answered."""
        cfg = self.config
        deadline = cfg.client.start_deadline
        progress.begin("connecting", deadline_s=deadline, endpoints=len(client.endpoints))

        def waiting(url: str, waited: float) -> None:
            progress.on_event(Event("connecting", "update", {"url": url, "waited_s": waited}))

        asking = asyncio.create_task(client.served_models(deadline, waiting))
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({asking, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not asking.done():  # Ctrl-C while waiting for the endpoint to answer
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
            self.outcome = "interrupted"
            progress.on_event(Event("connecting", "end", {}, ok=False))
            return False
        served = asking.result()
        silent = [url for url, ids in served.items() if ids is None]
        if silent:
            self.outcome = "server_down"
            self.note = (f"{', '.join(silent)} did not answer GET /v1/models within [client] start_deadline "
                         f"{deadline:g} s; nothing was sent, every item is still pending")
            progress.on_event(Event("connecting", "end", {"silent": silent}, ok=False))
            return False
        requested = cfg.server.requested_model if cfg.server is not None else None
        field = "served_model_name" if cfg.server is not None and cfg.server.served_model_name else "model"
        for url, ids in served.items():
            if requested is not None and ids and requested not in ids:
                progress.on_event(Event("connecting", "end", {"refused": requested}, ok=False))
                served_list = ", ".join(repr(i) for i in ids)
                raise ConfigError(cfg.source, [(f"{cfg.source} [server] {field}",
                                                f"{requested!r} is not served by {url}; it serves {served_list}")])
        listed = next((ids for ids in served.values() if ids), [])
        model = requested or (listed[0] if listed else None)
        if model is not None:
            client.use_model(model)
        self.model = model
        progress.on_event(Event("connecting", "end", {"model": model}))
        return True

    # --- dispatch -----------------------------------------------------------------------------

    async def dispatch(self, writer: LedgerWriter, client: Client, progress: Progress) -> None:
        tasks: dict[asyncio.Task[Any], str] = {}
        self._scrape_task: asyncio.Task[None] | None = None
        try:
            await self._dispatch(writer, client, progress, tasks)
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
            progress.server, progress.server_endpoints = {"running": None, "waiting": None}, {}

    async def _dispatch(self, writer: LedgerWriter, client: Client, progress: Progress,
                        tasks: dict[asyncio.Task[Any], str]) -> None:
        """Claim, send, collect, react; until nothing is left or the run must end. Each turn of the
        loop is one of each named step below; a step that ends the run says so with ``_END``."""
        d = _Dispatch(tasks, PrefixOrder(enabled=self.config.run.prefix_order))
        cfg = self.config
        d.one_request = cfg.sampling.one_request(cfg.server.engine if cfg.server else None)
        while True:
            await self._refill(d, writer, client, progress)
            if not tasks:
                if not d.exhausted and not d.server_down and not self.stop_requested.is_set() and self._ingesting():
                    await self._wait_ingested(0.5)  # everything ingested so far is done: wait for more
                    continue
                break
            progress.in_flight = len(tasks) + len(d.order)  # claimed: sent, or waiting in harvest's queue
            d.server_down = await self._collect(d, writer, progress) or d.server_down
            verdict = await self._react(d, writer, client)
            if verdict is _END:
                break
            if verdict is _AGAIN:
                continue
            self._tick(d, client, progress)
        if self.stop_requested.is_set() and self.outcome == "finished":
            self.outcome = "interrupted"
        held = d.order.drain()
        d.claimed_at.clear()
        if held:  # claimed, never sent: back to pending, uncharged
            await writer.release(held)
        self._commit_failures(writer, progress, self.breaker.finish())
        progress.in_flight = 0

    # The named steps of one dispatch turn.

    async def _refill(self, d: _Dispatch, writer: LedgerWriter, client: Client, progress: Progress) -> None:
        """Claim up to ``CLAIM_FACTOR`` x the client's capacity (it moves with ``concurrency =
        "auto"``), then send from the claimed rows, prefix-aware (campaign/order.py), while the client
        has room for them plus a little headroom, so its own queue stays short and in our order."""
        capacity = client.capacity()
        if self.stop_requested.is_set() or d.server_down:
            return
        want = capacity * CLAIM_FACTOR - len(d.tasks) - len(d.order)
        if not d.exhausted and want > 0:
            # Asked before the claim: an ingest that ended before it committed before it.
            ingesting = self._ingesting()
            rows = await writer.claim(want)
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
            samples = _Samples(functools.partial(
                generate_samples, client, item, [r.sample for r in group], run=cfg.run, sampling=cfg.sampling,
                settings_hash=self.settings_hash, one_request=d.one_request, affinity=affinity))
            for index, row in enumerate(group):
                task = asyncio.create_task(self._one(client, writer, progress, row, samples, index,
                                                     d.claimed_at.pop(row.key, None)))
                task.add_done_callback(d.finished.put_nowait)
                d.tasks[task] = row.key

    async def _one(self, client: Client, writer: LedgerWriter, progress: Progress, row: Any, samples: _Samples,
                   index: int, claimed_at: float | None = None) -> None:
        """Generate one sample of an item and commit its outcome (the writer keeps it exactly once).
        ``claimed_at``: when the ledger handed it out (its wait in the send order counts as queued)."""
        row_id = row.key  # (id, sample): one ledger row per sample
        if await self.context.skipped(client, writer, progress, row_id, row.item):
            return  # its prompt cannot fit the model's context: never sent
        t0 = claimed_at or time.monotonic()  # claimed; the request waits for a slot in the client
        try:
            gen = await samples.get(index)
        except RequestError as exc:
            failure = Failure(row.id, str(exc), f"http_{exc.status}" if exc.status else "request", row.sample)
            if self.breaker.holds(failure.error_class):  # committed once the streak ends
                self._commit_failures(writer, progress, self.breaker.failed(failure))
            else:
                self._commit_failures(writer, progress, [*self.breaker.succeeded(), failure])
            return
        self._commit_failures(writer, progress, self.breaker.succeeded())
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

    async def _collect(self, d: _Dispatch, writer: LedgerWriter, progress: Progress) -> bool:
        """Take the requests that finished; release the items whose server stayed sick (True then)."""
        done = await self._finished(d.finished, 0.5)
        sick: list[str] = []
        for task in done:
            row_id = d.tasks.pop(task, None)
            if row_id is None:
                continue  # cancelled and released above (a relaunch, an interrupt): already handled
            exc = task.exception()
            if isinstance(exc, ServerSick):
                sick.append(row_id)
                progress.error("server_sick")
            elif exc is not None:
                raise exc
        if sick:
            await writer.release(sick)
        return bool(sick)

    async def _react(self, d: _Dispatch, writer: LedgerWriter, client: Client) -> object:
        """What the turn's outcome asks for: ``_END`` the run (breaker, server down, interrupt),
        ``_AGAIN`` after a relaunch, else None."""
        tasks = d.tasks
        if self.breaker.trip is not None:
            # Every recent request failed the same way: the job, not the items, is wrong.
            await self._release_in_flight(writer, tasks, [(f.item_id, f.sample) for _, f in self.breaker.held])
            self.outcome, self.note = "stopped", self.breaker.trip.describe()
            return _END
        if d.server_down and not tasks:
            # Every endpoint stayed down past the client's health deadline.
            if self.server is not None and await self.relaunch():
                await client.check_health()
                d.server_down, d.exhausted = False, False
                return _AGAIN
            self.outcome, self.note = "server_down", "every endpoint stayed down past [client] health_deadline"
            return _END
        if self.server_exited() and not d.server_down:
            # The managed server died: held requests wait for health; relaunch it now.
            released = [tasks[t] for t in tasks]
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            tasks.clear()
            await writer.release(released)
            if not await self.relaunch():
                self.outcome, self.note = "server_down", "the managed server exited and relaunches are used up"
                return _END
            await client.check_health()
            d.exhausted = False
            return _AGAIN
        if self.stop_requested.is_set() and tasks:
            await self._release_in_flight(writer, tasks)
            self.outcome = "interrupted"
            return _END
        return None

    def _tick(self, d: _Dispatch, client: Client, progress: Progress) -> None:
        """Every ``progress_interval``: a scrape beside dispatch, the targets, the display."""
        now = time.monotonic()
        if now - d.last_update < self.config.run.progress_interval:
            return
        d.last_update = now
        # The scrape runs beside dispatch: a server slow to answer /metrics while it
        # generates must not hold up the refill of its own queue. The display shows the
        # last scrape that finished.
        if self._scrape_task is None or self._scrape_task.done():
            self._scrape_task = asyncio.create_task(self._scrape(client, progress))
        progress.concurrency = {t.url: t.target for t in client.concurrency_targets()}
        progress.update()

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

    @staticmethod
    def _commit_failures(writer: LedgerWriter, progress: Progress, failures: list[Failure]) -> None:
        """Commit item failures (each charged one attempt), e.g. those the breaker held and let go."""
        for failure in failures:
            writer.charge_attempt((failure.item_id, failure.sample))
            writer.fail(failure)
            progress.error(failure.error_class)
            progress.record(Status.FAILED.value)

    @staticmethod
    async def _release_in_flight(writer: LedgerWriter, tasks: dict[asyncio.Task[Any], str],
                                 also: Sequence[str] = ()) -> None:
        """Cancel the requests in flight and put their items (and ``also``) back to pending, uncharged."""
        ids = [*tasks.values(), *also]
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks.clear()
        await writer.release(ids)

    async def _scrape(self, client: Client, progress: Progress) -> None:
        try:
            metrics = await asyncio.wait_for(client.scrape_metrics(), timeout=2.0)
        except (asyncio.TimeoutError, Exception):  # metrics are informative only
            return
        if self.timeline is not None:
            self.timeline.observe_metrics(metrics)
        running = waiting = None
        per_endpoint: dict[str, dict[str, float | None]] = {}
        for url, values in metrics.items():
            mine: dict[str, float | None] = {"running": None, "waiting": None}
            for name, value in values.items():
                if name in ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"):
                    running = (running or 0) + value
                    mine["running"] = (mine["running"] or 0) + value
                elif name in ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"):
                    waiting = (waiting or 0) + value
                    mine["waiting"] = (mine["waiting"] or 0) + value
            per_endpoint[url] = mine
        progress.server = {"running": running, "waiting": waiting}
        progress.server_endpoints = per_endpoint
        self.prefix_cache.observe(metrics)
        progress.prefix_cache = self.prefix_cache.snapshot()

    # --- the whole session ----------------------------------------------------------------------

    async def run(self) -> RunReport:
        t0 = time.monotonic()
        ledger = self.open_ledger()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._request_stop)
                installed.append(sig)
        try:
            counts = ledger.counts()
            total = sum(counts.values())
            if not ledger.created:
                self.resumed = resume_line(counts, ledger.recovered, ledger.ingest_state(), self._records is not None)
                log.info("%s", self.resumed)
            final_before = sum(counts[s] for s in (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED))
            progress = Progress(self.run_dir, total=total, already_final=final_before, live=self.live,
                                console=self.console, data_path=self.config.data.path if self.config.data else None,
                                before={s.value: counts[s] for s in (Status.DONE, Status.TRUNCATED, Status.FAILED,
                                                                     Status.SKIPPED)})
            self.on_event = progress.on_event
            progress.ingest_began(t0, self._first_rows, ongoing=self._records is not None)
            progress.timeline = self.timeline = Timeline.open(self.run_dir)
            with progress:
                await asyncio.to_thread(self.stop_leftover)  # also when nothing is left to generate
                if self._first_batch_all_skipped(counts):
                    # A whole first batch of rows that do not fit [data] is the job's mistake: no
                    # launch for it; the rest of the dataset is read next time, under fixed settings.
                    self._close_records()
                    self.outcome = "stopped"
                    self.note = (f"the {self._first_batch[0]:,} rows read first were all skipped: fix [data] "
                                 f"and run again (the skipped rows are read again)")
                elif counts[Status.PENDING] or counts[Status.RUNNING] or self._records is not None:
                    try:
                        async with LedgerWriter(ledger) as writer:
                            try:
                                if self._records is not None:
                                    progress.ingesting = True
                                    self._ingest_task = asyncio.create_task(self._ingest_rest(writer, progress))
                                await self.start_server()
                                urls = getattr(self.server, "urls", None)  # far servers: their tunnels
                                async with Client.from_config(self.config, urls) as client:
                                    attach = getattr(self.server, "attach_client", None)
                                    if attach is not None:  # Ray: endpoints follow replacement servers
                                        attach(client)
                                    progress.client_stats = client.stats
                                    progress.health_deadline = self.config.client.health_deadline
                                    if not self.config.client.auto:
                                        progress.concurrency_limit = int(self.config.client.concurrency)
                                    if await self._check_endpoints(client, progress):
                                        progress.begin("generating", concurrency=client.capacity())
                                        await self.dispatch(writer, client, progress)
                                    progress.on_event(Event("generating", "end", {
                                        "outcome": self.outcome, "note": self.note},
                                        ok=self.outcome == "finished"))
                            finally:
                                await self._finish_ingest()
                    finally:
                        await self.stop_server()
                progress.state = self.outcome
                progress.note = self.note
                progress.update()
            if self.model is not None:
                ledger.set_meta("model_used", self.model)
            totals = ledger.check_totals()
            skip_reasons = tuple(ledger.skip_reasons())
        finally:
            if self.timeline is not None:
                self.timeline.close(self.outcome)
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._close_records()
            ledger.close()
        data = self.config.data
        assert data is not None
        return RunReport(self.run_dir, totals, progress.done, time.monotonic() - t0, self.outcome,
                         self.relaunches, tuple(self.stop_reports), ledger.recovered, self.note,
                         self.breaker.trip, self.requeued, skip_reasons,
                         skipped_problem(totals, data.max_skipped_share) if totals.ok else None, self.resumed)

    def _request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.warning("stop requested: finishing committed work, releasing in-flight items")
        self.stop_requested.set()
        if self.server is not None and self.server.ready is None:
            self.server.cancel()  # still starting: give up the launch (its cleanup stops what started)


async def run_campaign(config: HarvestConfig, *, allow_mixed: bool = False, force: bool = False,
                       live: bool | None = None, server_factory: Any = None,
                       on_preflight: Any = None, retry: tuple[str, ...] = (), console: Any = None) -> RunReport:
    """Run (or resume) the campaign described by ``config``; see the module docstring.

    ``on_preflight(report)`` is called with the launch's preflight report before the launch.
    ``retry``: what to put back to pending first (``failed``, ``truncated`` or an error class).
    ``console`` (a rich Console) is the one the live display draws on; print through it meanwhile.
    """
    return await _Campaign(config, allow_mixed=allow_mixed, force=force, live=live,
                           server_factory=server_factory, on_preflight=on_preflight, retry=retry,
                           console=console).run()


__all__ = ["RunReport", "dataset_fingerprint", "output_settings", "run_campaign"]
