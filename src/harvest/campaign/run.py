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

The steps live beside this module, one file per named part of the session: ``campaign/intake.py``
(the ledger and the dataset's ingest), ``campaign/supervise.py`` (launch, verified stop, relaunch,
the endpoints' check), ``campaign/dispatch.py`` (the dispatch loop); here, the session that runs
them in order and the report of how it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.campaign.breaker import Breaker, Trip
from harvest.campaign.context import ContextGuard
from harvest.campaign.dispatch import DispatchSteps
from harvest.campaign.folder import resume_line, skipped_problem
from harvest.campaign.intake import IngestSteps, dataset_fingerprint, output_settings
from harvest.campaign.progress import Progress
from harvest.campaign.supervise import ServerSteps
from harvest.campaign.timeline import Timeline
from harvest.client import Client, EngineLimit
from harvest.client.metrics import PrefixCacheMeter
from harvest.config import HarvestConfig, ServerConfig
from harvest.dataset.skips import SkipReason
from harvest.errors import ConfigError
from harvest.events import Event
from harvest.ledger import LedgerWriter, Status, Totals, hash_settings
from harvest.placement import from_config
from harvest.server import StopReport
from harvest.server.batch import batch_limit, batch_limit_exact, has_metrics
from harvest.server.state import hold_index

log = logging.getLogger("harvest.campaign")


def engine_limit(server: ServerConfig) -> EngineLimit:
    """What the client may know of an engine launched with ``server``'s settings, for ``concurrency =
    "auto"``: its batch limit, whether that is its hard cap, whether it has /metrics."""
    return EngineLimit(batch_limit(server), batch_limit_exact(server), has_metrics(server))


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


class _Campaign(IngestSteps, ServerSteps, DispatchSteps):
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

    async def run(self) -> RunReport:
        t0 = time.monotonic()
        server = self.config.server
        if server is not None and server.launched and self.placement.kind == "local":
            hold_index().close()  # a state dir another user owns: refused before anything is written
        ledger = self.open_ledger()
        loop = asyncio.get_running_loop()
        #: Signals taken for a clean stop, and the handler each had: ``remove_signal_handler`` leaves
        #: the default, and a program that embeds the run (or a test session that stops its engines
        #: on SIGTERM) would lose its own.
        installed: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                before = signal.getsignal(sig)
                loop.add_signal_handler(sig, self._request_stop)
                installed[sig] = before
        try:
            counts = ledger.counts()
            total = sum(counts.values())
            if not ledger.created:
                self.resumed = resume_line(counts, ledger.recovered, ledger.ingest_state(), self._records is not None)
                log.info("%s", self.resumed)
            final_before = sum(counts[s] for s in (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED))
            assert ledger.folder is not None  # opened for writing: the run folder is held
            progress = Progress(ledger.folder, total=total, already_final=final_before, live=self.live,
                                console=self.console, data_path=self.config.data.path if self.config.data else None,
                                before={s.value: counts[s] for s in (Status.DONE, Status.TRUNCATED, Status.FAILED,
                                                                     Status.SKIPPED)})
            self.on_event = progress.on_event
            progress.ingest_began(t0, self._first_rows, ongoing=self._records is not None)
            progress.timeline = self.timeline = Timeline.open(ledger.folder)
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
                                # each server's own settings (a [[hosts]] entry's batch limit)
                                configs = getattr(self.server, "server_configs", None) if urls else None
                                engines = None if configs is None else [engine_limit(c) for c in configs]
                                engine = None if server is None else engine_limit(server)
                                async with Client.from_config(self.config, urls, engines, engine=engine) as client:
                                    attach = getattr(self.server, "attach_client", None)
                                    if attach is not None:  # Ray: endpoints follow replacement servers
                                        attach(client)
                                    progress.client_stats = client.stats
                                    progress.health_deadline = self.config.client.health_deadline
                                    if not self.config.client.auto:
                                        progress.concurrency_limit = int(self.config.client.concurrency)
                                    if await self._check_endpoints(client, progress):
                                        await self.read_cache_counters(client, progress)
                                        progress.begin("generating", concurrency=client.capacity())
                                        await self.dispatch(writer, client, progress)
                                        if self.outcome not in ("interrupted", "server_down"):
                                            await self.read_cache_counters(client, progress)
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
            for taken, before in installed.items():
                loop.remove_signal_handler(taken)
                if before is not None:  # None: not set from Python, nothing to give back
                    with contextlib.suppress(ValueError, TypeError):
                        signal.signal(taken, before)
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


__all__ = ["RunReport", "dataset_fingerprint", "engine_limit", "output_settings", "run_campaign"]
