"""The campaign: dataset -> ledger -> server(s) -> results, lossless and resumable.

    report = await run_campaign(config, placement=from_config(config))

Order of work: open the ledger (refusing settings that change outputs unless ``allow_mixed``),
ingest the dataset's first batch (so that a dataset that cannot be read fails before any launch),
launch the server when the job names one to launch (a server a killed earlier session left
running is stopped first, by its record; then preflight -> launch -> ready) while the rest of the
dataset is ingested batch by batch beside it, dispatch pending items through the client as soon
as they are in the ledger (claimed oldest first, sent prefix-aware: campaign/run/order.py), commit
each result exactly once through the single writer, then the
verified stop and the totals check ``done + truncated + failed + skipped == unique input``. An
interrupted ingest resumes by position, passing over what it committed without normalizing it.

Who pays for a failure is decided by type: RequestError fails the item; ServerSick (every endpoint
down past the client's health deadline) releases in-flight items back to pending uncharged and, for
a server harvest manages, relaunches it (at most ``run.max_relaunches`` times). When
``run.breaker_window`` requests in a row fail with the same class and message (campaign/run/breaker.py),
the job is at fault: dispatch stops, those items and the ones in flight go back to pending
uncharged, and the outcome is "stopped". ``retry`` puts failed or truncated items back to pending
first (recorded in the ledger), under the same settings-hash rule as any resume. Ctrl-C or SIGTERM
stops dispatch, releases what is in flight, commits what finished and stops the server: the run
resumes where it was. This module never kills a process itself: the supervisor does, by its record.

The session's mutable state is one :class:`RunState` (``campaign/run/state.py``: the outcome and its
note, the fleet, the stop reports, the held run folder, ...); its steps live beside this module,
one file each, and are handed the state and what else they use: ``campaign/run/intake.py`` (the
ledger and the dataset's ingest), ``campaign/run/supervise.py`` (launch, verified stop, relaunch),
``campaign/run/connect.py`` (the endpoints' check), ``campaign/run/dispatch.py`` (the dispatch loop).
Here, the session that makes them, runs them in order, holds the signals, the display and the run
folder's watch, and reports how it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The timeline bins and the logprob records encode with numpy on the event loop; its modules import
# it where that starts (a command that only reads a run needs none), so the campaign imports it
# here, before its loop runs: an import on the loop would stall every request in flight.
import numpy  # noqa: F401

from harvest import safefiles
from harvest.words import counted
from harvest.campaign.run.breaker import Trip
from harvest.campaign.run.connect import check_endpoints
from harvest.campaign.run.dispatch import Dispatch
from harvest.campaign.run.folder import failed_problem, resume_line, skipped_problem
from harvest.campaign.run.intake import Intake, dataset_fingerprint, output_settings
from harvest.campaign.outputs.progress import PROGRESS_FILE, Progress, RunWatch
from harvest.campaign.run.outside import Launcher, Outside
from harvest.campaign.run.runner import RUNNER_FILE
from harvest.campaign.run.state import RunState
from harvest.campaign.run.supervise import Supervision
from harvest.campaign.outputs.timeline import TIMELINE_FILE, Timeline
from harvest.client import Client, RetryPolicy
from harvest.client.endpoints import normalize_url
from harvest.config import COMMAND_LINE, KEYWORDS, HarvestConfig
from harvest.dataset.skips import SkipReason
from harvest.errors import ConfigError, LaunchError, LedgerError, PreflightFailed
from harvest.events import Event, Listener
from harvest.ledger import Ledger, LedgerWriter, Status, Totals, hash_settings
from harvest.placement import OnPreflight, Placement, engine_limit
from harvest.redact import redact_text
from harvest.stops import StopReport

log = logging.getLogger("harvest.campaign")

#: How often the session looks whether the run folder's name still names the folder it holds.
FOLDER_CHECK_S = 1.0


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
    #: The run folder, still held (the report is written through it; the caller closes it).
    folder: safefiles.Folder | None = None
    #: Set when more than ``[run] max_failed_share`` of the items failed.
    failed_problem: str | None = None
    #: Endpoints found hung (requests held, ``/health`` answering) when the run gave up: restart them.
    hung: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """What ``harvest run`` exits with: 0 ok, 130 interrupted (resume by running it again), else 1."""
        return 0 if self.ok else 130 if self.outcome == "interrupted" else 1

    @property
    def ok(self) -> bool:
        """The run finished, every unique input item is accounted for, and not too many were
        skipped or failed."""
        return (self.outcome == "finished" and self.totals.ok and self.skip_problem is None
                and self.failed_problem is None)


class Session:
    """One session of a run: makes the run's state and its steps (intake, supervision, dispatch),
    runs them in order and reports how it ended. Not reusable."""

    def __init__(self, config: HarvestConfig, placement: Placement, *, allow_mixed: bool, force: bool,
                 watch: RunWatch | None, all_hosts: bool = False,
                 on_preflight: OnPreflight | None = None, retry: tuple[str, ...] = (), writes: tuple[str, ...] = (),
                 launcher: Launcher | None = None):
        if config.data is None:  # the dataset, said the way this job was given
            how = {COMMAND_LINE: "give --data FILE", KEYWORDS: "give data=FILE"}.get(
                config.source, f"add a [data] table with its path to {config.source}, or give --data FILE")
            who = "harvest.run" if config.source == KEYWORDS else "`harvest run`"
            raise ConfigError(config.source, [(f"{config.source} [data]", f"{who} needs a dataset: {how}")])
        if config.server is None and not config.client.endpoints:
            raise ConfigError(config.source, [(f"{config.source} [server]",
                                               "`harvest run` needs a [server] table or [client] endpoints")])
        self.config = config
        self.run_dir = Path(config.output.dir)
        self.watch = watch  # the display (the command line's panel), fed by events and snapshots
        #: Where the servers run (harvest.placement), chosen once by the command; it makes them.
        self.placement = placement
        #: Files the caller writes in the run folder after the session (the report), checked with ours.
        self.writes = writes
        #: What changes while the session runs; the steps below are handed it.
        self.state = RunState(config, self.run_dir, hash_settings(output_settings(config)))
        self.intake = Intake(self.state, allow_mixed=allow_mixed, force=force, retry=retry)
        self.supervision = Supervision(self.state, placement, placement.fleet(all_hosts=all_hosts), force=force,
                                       on_preflight=on_preflight)
        #: runner.json, /metrics, [notify] and the watch beside the run.
        self.outside = Outside(self.state, launcher)

    async def run(self) -> RunReport:
        """Open the ledger, then (under the display) stop what an earlier session left, launch,
        dispatch, stop; then the totals check. Signals taken for the session are given back.
        Cancelling the task that awaits it is a clean stop, as SIGINT is (the items in flight go
        back to pending, the servers get their verified stop); then the cancellation goes on."""
        inner = asyncio.ensure_future(self._run())
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.done():
                raise
            self.state.request_stop()
            try:
                await asyncio.shield(inner)  # bounded by the stop's own deadlines
            except asyncio.CancelledError:
                inner.cancel()  # cancelled again while stopping: no clean stop then
                raise
            except Exception as exc:  # noqa: BLE001 - the caller cancelled: that is what it hears
                log.warning("the run ended with an error while it stopped for a cancellation: %s", exc)
            raise

    async def _run(self) -> RunReport:
        """The session's steps (:meth:`_steps`); how it ended is written down (runner.json) and told
        (``[notify]``), whatever ended it."""
        try:
            report = await self._steps()
        except BaseException as exc:
            await self.outside.end(*ended_by(exc), ok=False)
            raise
        await self.outside.end(report.outcome, report.exit_code, report.note, ok=report.ok)
        return report

    async def _steps(self) -> RunReport:
        """The session's steps; file and SQLite work runs on worker threads, so the event loop the
        session shares (a notebook's, an application's) is never held up by the disk."""
        t0 = time.monotonic()
        state, intake = self.state, self.intake
        server = self.config.server
        if server is not None and server.launched:
            # e.g. a state dir another user owns: refused before any write
            await asyncio.to_thread(self.placement.hold_state_dir)
        ledger = await asyncio.to_thread(intake.open_ledger)
        assert ledger.folder is not None  # opened for writing: the run folder is held
        state.folder = ledger.folder.dup()
        installed = self._take_signals()
        files = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harvest-files")  # in order, off the loop
        try:
            counts = await asyncio.to_thread(self._open_files, ledger)
            await self.outside.begin()  # runner.json, /metrics, [notify]: refused (a port taken) before any launch
            progress = await asyncio.to_thread(self._open_progress, ledger, counts, t0)
            progress.defer = lambda write: files.submit(_logged, write)
            if state.timeline is not None:
                state.timeline.defer = progress.defer
            self.outside.attach(progress)
            with progress:
                await asyncio.to_thread(self.supervision.stop_leftover)  # also when nothing is left to generate
                if intake.first_batch_all_skipped(counts):
                    self._no_launch_for_skipped_rows()
                elif counts[Status.PENDING] or counts[Status.RUNNING] or intake.records is not None:
                    await self._launch_and_dispatch(ledger, progress)
                self._say_if_moved()
                progress.state = state.outcome
                progress.note = state.note
                progress.update()
            totals, skip_reasons = await asyncio.to_thread(self._settle, ledger)
        finally:
            self._give_back_signals(installed)
            await asyncio.to_thread(self._close, ledger, files)
        return self._report(totals, progress.done, time.monotonic() - t0, skip_reasons, ledger.recovered)

    def _open_files(self, ledger: Ledger) -> dict[Status, int]:
        """The run folder's files checked (:meth:`_refuse_unsafe_files`), and the items per status."""
        self._refuse_unsafe_files(ledger)
        return ledger.counts()

    def _settle(self, ledger: Ledger) -> tuple[Totals, tuple[SkipReason, ...]]:
        """What the ledger holds at the end: the model used written down, the totals, the skip reasons."""
        if self.state.model is not None:
            ledger.set_meta("model_used", self.state.model)
        return ledger.check_totals(), tuple(ledger.skip_reasons())

    def _close(self, ledger: Ledger, files: ThreadPoolExecutor) -> None:
        """The timeline's last write, every file write done, the dataset and the ledger closed."""
        try:
            if self.state.timeline is not None:
                self.state.timeline.close(self.state.outcome, self.state.note)
        finally:
            files.shutdown(wait=True)
            self.intake.close_records()
            ledger.close()

    def _refuse_unsafe_files(self, ledger: Ledger) -> None:
        """Every file this session (and its caller) will write in the run folder, checked before
        anything is launched, so that no refusal comes once an engine runs: the panel's and the
        timeline's, the caller's, and the server folder's records as the placement keeps them (the
        ledger's own were checked as it opened)."""
        assert ledger.folder is not None  # opened for writing: the run folder is held
        for name in (PROGRESS_FILE, TIMELINE_FILE, RUNNER_FILE, *self.writes):
            ledger.folder.check_file(name)
        server = self.config.server
        if server is not None and server.launched:
            self.placement.check_records(self.state.server_dir(), server)

    async def _watch_folder(self) -> None:
        """Stop the session (verified stop of its servers, in-flight items released) once the run
        folder's name names another folder: what is written still goes to the folder held, but the
        user's `status`, `export` and next `run` by that name would find another run."""
        while True:
            await asyncio.sleep(FOLDER_CHECK_S)
            if (why := self.state.folder_moved()) is not None:
                log.error("the run folder was replaced while the run went on: %s; stopping", why)
                self.state.request_stop()
                return

    def _say_if_moved(self) -> None:
        """The outcome and note of a session whose run folder was replaced (during it or at its end)."""
        state = self.state
        why = state.folder_moved()
        if why is None:
            return
        put_back = state.folder.where_now() if state.folder is not None else self.run_dir
        state.end("stopped", f"the run folder was replaced during the run: {why}; everything this run wrote is "
                             f"in the folder it held, nothing in the other; move {put_back} back to "
                             f"{self.run_dir} and run again to resume")

    def _take_signals(self) -> dict[int, Any]:
        """SIGINT / SIGTERM ask for a clean stop; returns the handler each had (``Any``: whatever
        ``signal.getsignal`` gave). ``remove_signal_handler`` leaves the default, and a program that
        embeds the run (or a test session that stops its engines on SIGTERM) would lose its own."""
        loop = asyncio.get_running_loop()
        installed: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                before = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.state.request_stop)
                installed[sig] = before
        return installed

    @staticmethod
    def _give_back_signals(installed: dict[int, Any]) -> None:
        loop = asyncio.get_running_loop()
        for taken, before in installed.items():
            loop.remove_signal_handler(taken)
            if before is not None:  # None: not set from Python, nothing to give back
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(taken, before)

    def _open_progress(self, ledger: Ledger, counts: dict[Status, int], t0: float) -> Progress:
        """The progress of the session (told to its watch) and its timeline, from what the ledger
        held at the start."""
        total = sum(counts.values())
        ongoing = self.intake.records is not None
        if not ledger.created:
            self.state.resumed = resume_line(counts, ledger.recovered, ledger.ingest_state(), ongoing)
            log.info("%s", self.state.resumed)
        elif self.intake.taken is not None:  # a folder of an earlier attempt that produced nothing
            self.state.resumed = self.intake.taken
        final = (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED)
        assert ledger.folder is not None  # opened for writing: the run folder is held
        progress = Progress(ledger.folder, total=total, already_final=sum(counts[s] for s in final),
                            data_path=self.config.data.path if self.config.data else None,
                            before={s.value: counts[s] for s in final}, watch=self.watch)
        self.state.on_event = progress.on_event
        progress.ingest_began(t0, self.intake.first_rows, ongoing=ongoing)
        progress.timeline = self.state.timeline = Timeline.open(ledger.folder)
        return progress

    def _no_launch_for_skipped_rows(self) -> None:
        """A whole first batch of rows that do not fit [data] is the job's mistake: no launch for
        it; the rest of the dataset is read next time, under fixed settings."""
        self.intake.close_records()
        read = self.intake.first_batch[0]
        self.state.end("stopped", f"the {counted(read, 'row')} read first {'was' if read == 1 else 'were all'} "
                                  f"skipped: fix [data] and run again (the skipped rows are read again)")

    async def _launch_and_dispatch(self, ledger: Ledger, progress: Progress) -> None:
        """The rest of the ingest beside the launch and the dispatch; the server's verified stop
        always, after the ingest has stopped."""
        try:
            async with LedgerWriter(ledger) as writer:
                try:
                    self.intake.ingest_rest(writer, progress)
                    watch = asyncio.create_task(self._watch_folder())
                    try:
                        if await self._start_unless_moved():
                            async with self._client() as client:
                                await self._generate(writer, client, progress)
                    finally:
                        watch.cancel()
                        await asyncio.gather(watch, return_exceptions=True)
                finally:
                    await self.intake.finish()
        finally:
            await self.supervision.stop()

    async def _start_unless_moved(self) -> bool:
        """The launch; False when it was cancelled because the run folder was replaced (the
        session's stop: its note says why)."""
        try:
            await self.supervision.start()
        except LaunchError:
            if self.state.moved is None:
                raise
            return False
        return self.state.moved is None

    def _client(self) -> Client:
        """The client of the job's endpoints: the fleet's URLs (far servers: their tunnels) with what
        is known of each server's engine (a ``[[hosts]]`` entry's own batch limit)."""
        server, fleet = self.config.server, self.state.fleet
        return Client.from_config(self.config, fleet.urls if fleet is not None else None,
                                  fleet.engine_limits() if fleet is not None else None,
                                  engine=None if server is None else engine_limit(server),
                                  retry=RetryPolicy(hang_floor=self.config.client.hang_floor))

    async def _generate(self, writer: LedgerWriter, client: Client, progress: Progress) -> None:
        """Check the endpoints, then dispatch until the run ends (with the prefix-cache counters
        read before and after)."""
        state = self.state
        if state.fleet is not None:
            state.fleet.attach(client)  # Ray: the endpoints follow replacement servers
        progress.client_stats = client.stats
        progress.health_deadline = self.config.client.health_deadline
        progress.hang_deadline = self.config.client.hang_deadline
        progress.managed = frozenset(normalize_url(u) for u in state.fleet.urls) if state.fleet is not None \
            else frozenset()
        if not self.config.client.auto:
            progress.concurrency_limit = int(self.config.client.concurrency)
        if await check_endpoints(state, client, progress):
            dispatch = Dispatch(state, self.intake, self.supervision, writer=writer, client=client,
                                progress=progress)
            await dispatch.read_cache_counters()
            progress.begin("generating", concurrency=client.capacity())
            await dispatch.run()
            if state.outcome not in ("interrupted", "server_down"):
                await dispatch.read_cache_counters()
        progress.on_event(Event("generating", "end", {"outcome": state.outcome, "note": state.note},
                                ok=state.outcome == "finished"))

    def _report(self, totals: Totals, finished: int, elapsed_s: float, skip_reasons: tuple[SkipReason, ...],
                recovered: int) -> RunReport:
        data, state = self.config.data, self.state
        assert data is not None
        return RunReport(self.run_dir, totals, finished, elapsed_s, state.outcome,
                         state.relaunches, tuple(state.stop_reports), recovered, state.note,
                         state.trip, state.requeued, skip_reasons,
                         skipped_problem(totals, data.max_skipped_share, data.path) if totals.ok else None,
                         state.resumed,
                         state.folder, failed_problem(totals, self.config.run.max_failed_share), state.hung)


def _logged(write: Any) -> None:
    """A file write of the run's records, on the session's writer thread: what it raises is said,
    never lost in a future nobody reads (the ledger, written apart, stays the truth)."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - a record not written must not end the run
        log.warning("a run record was not written: %s", exc)


async def run_campaign(config: HarvestConfig, *, placement: Placement, all_hosts: bool = False,
                       allow_mixed: bool = False, force: bool = False, watch: RunWatch | None = None,
                       on_preflight: OnPreflight | None = None, retry: tuple[str, ...] = (),
                       writes: tuple[str, ...] = (), launcher: Launcher | None = None) -> RunReport:
    """Run (or resume) the campaign described by ``config``; see the module docstring.

    ``placement``: where the servers run, as the command chose it (``harvest run``:
    ``from_config(config)``, once). ``all_hosts``: with
    ``[[hosts]]``, refuse unless every host passes preflight.
    ``on_preflight(report)`` is called with the launch's preflight report before the launch.
    ``retry``: what to put back to pending first (``failed``, ``truncated`` or an error class).
    ``watch``: who shows the run (``harvest run``'s panel), fed by its events and progress
    snapshots; None shows nothing.
    ``writes``: names of files the caller writes in the run folder afterwards (the report): refused
    with the run's own before anything is launched.
    ``launcher``: how the session was started (``harvest run --detach``: its log), for runner.json.
    """
    return await Session(config, placement, allow_mixed=allow_mixed, force=force, watch=watch, all_hosts=all_hosts,
                         on_preflight=on_preflight, retry=retry, writes=writes, launcher=launcher).run()


def ended_by(exc: BaseException) -> tuple[str, int, str]:
    """(outcome, exit code, note) of a session an exception ended, as ``harvest run`` exits on it."""
    if isinstance(exc, PreflightFailed):
        return "refused", 1, "refused by preflight"
    if isinstance(exc, LaunchError):
        return ("interrupted", 130, "interrupted during the launch") if exc.reason == "cancelled" else \
            ("server_down", 1, f"the server did not start: {redact_text(str(exc).splitlines()[0])}")
    if isinstance(exc, (ConfigError, LedgerError)):
        return "failed", 2, redact_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        return "interrupted", 130, "interrupted"
    return "failed", 1, f"{type(exc).__name__}: {redact_text(str(exc))[:300]}"


__all__ = ["Launcher", "RunReport", "dataset_fingerprint", "ended_by", "engine_limit", "output_settings",
           "run_campaign"]
