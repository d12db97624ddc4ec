"""The run's input: the ledger opened under the resume rules, and the dataset ingested into it.

:class:`Intake`, one per session (``campaign/run/session.py``), given the run's state: open the
ledger, refusing settings that change outputs (``output_settings``, hashed) or a dataset that
changed (``dataset_fingerprint``) unless ``allow_mixed``; read again the rows skipped under other
``[data]`` settings; apply ``--retry``; ingest the dataset's first batch before any launch (so that
a dataset that cannot be read fails before a server starts), then the rest batch by batch beside
the launch and the dispatch, one transaction per batch through the single writer. An interrupted
ingest resumes by position, passing over what it committed without normalizing it. Nothing here
sends a request or touches a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
from pathlib import Path
from typing import Any

from harvest.campaign.run.distill import check_logprob_space, describe_samples
from harvest.campaign.run.folder import job_change
from harvest.campaign.run.state import RunState
from harvest.campaign.outputs.progress import Progress
from harvest.config import RELATIVE_PATHS, HarvestConfig
from harvest.dataset import is_batch_file, iter_items
from harvest.dataset.skips import SkipReason, describe_skips, shape_settings
from harvest.errors import ConfigError, LedgerError
from harvest.ledger import IngestBatch, IngestReport, Ledger, LedgerWriter, Status, prepare_ingest
from harvest.redact import escape_controls, redact_argv, redact_doc
from harvest.words import counted

log = logging.getLogger("harvest.campaign")

#: Input records per ingest transaction.
INGEST_BATCH = 10_000
#: Longest wait for the background ingest to finish its current batch once asked to stop.
INGEST_STOP_TIMEOUT = 60.0


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


def batch_models(config: HarvestConfig) -> set[str] | None:
    """The names a batch row's ``body.model`` may hold: the job's served name and model (None: no
    ``[server]``, any name)."""
    server = config.server
    if server is None:
        return None
    return {name for name in (server.served_model_name, server.model) if name}


def check_batch_sampling(config: HarvestConfig) -> None:
    """A batch file's rows set ``n`` and ``logprobs`` in their bodies: the job's own are refused."""
    data = config.data
    if data is None or not is_batch_file(data):
        return
    problems = [(f"{config.source} [sampling] {name}",
                 f"is {value}, but {data.path} is an OpenAI batch file: set {name} in the rows' bodies "
                 f"(each row is one request; docs/batch-files.md)")
                for name, value, unset in (("n", config.sampling.n, 1), ("logprobs", config.sampling.logprobs, 0))
                if value != unset]
    if problems:
        raise ConfigError(config.source, problems)


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
    if report.total_rows <= 0:
        return "ids: none (no rows)"
    if usable <= 0:  # no row became an item: whose ids they would have had is unknown
        return f"ids: none (every row was skipped; [data] id_field {data.id_field!r})" \
            if data is not None and data.id_field else "ids: none (every row was skipped)"
    if report.own_ids == 0:
        return f"ids: content hashes (no {field!r} field)"
    if report.own_ids >= usable:
        return f"ids: the rows' {field!r} field"
    return (f"ids: the rows' {field!r} field ({report.own_ids}), content hashes where a row has none "
            f"({usable - report.own_ids})")


class Intake:
    """The ledger and the dataset's ingest of one session: the ledger opened under the resume rules
    with the first batch ingested (:meth:`open_ledger`), then the rest beside the launch and the
    dispatch (:meth:`ingest_rest`), which dispatch asks about (:meth:`ingesting`,
    :meth:`wait_ingested`) and the session ends (:meth:`finish`)."""

    def __init__(self, state: RunState, *, allow_mixed: bool, force: bool, retry: tuple[str, ...] = ()):
        self.state = state
        self.config = state.config
        self.run_dir = state.run_dir
        self.allow_mixed = allow_mixed
        self.force = force
        self.retry = retry
        #: The dataset's records still to read, None once the ingest is complete or ended (``Any``:
        #: iter_items' generator, closed early when the session ends before the dataset does).
        self.records: Any = None
        #: Input rows read before the display started (this session), once the first batch is in.
        self.first_rows: int | None = None
        #: Rows of this session's first ingest batch, and how many of them were skipped.
        self.first_batch = (0, 0)
        # The background ingest: its task, a wake-up per committed batch, and its stop.
        self._task: asyncio.Task[None] | None = None
        self._ingested = asyncio.Event()
        self._stop = False
        #: What a folder that held no result did (took this job's settings), said once the session shows it.
        self.taken: str | None = None
        #: (error class, reason) -> rows skipped by this session's ingest, for the input line.
        self._skip_reasons: dict[tuple[str, str], int] = {}

    def open_ledger(self) -> Ledger:
        """The run's ledger, opened under the resume rules (module docstring), with ``--retry``
        applied and the dataset's first batch ingested (the rest: :meth:`ingest_rest`)."""
        data = self.config.data
        assert data is not None
        try:  # a dataset that cannot be read stops the run before a run folder or a ledger is made
            fingerprint = dataset_fingerprint(data.path)
        except OSError as exc:
            raise ConfigError(self.config.source, [(f"{self.config.source} [data] path",
                                                    f"cannot read {data.path}: {exc.strerror or exc}; nothing "
                                                    f"was created ({RELATIVE_PATHS})")]) from None
        check_batch_sampling(self.config)
        # A folder of another job is refused, unless it holds no result: then this job takes it.
        change = None if self.allow_mixed else job_change(self.run_dir, output_settings(self.config), data.path,
                                                           fingerprint)
        # The settings are stored as shown (a secret in extra_body as ***); their hash, from the
        # values as given, is what a resume compares.
        meta = {"job": self.config.recorded(), "job_file": self.config.source,
                "output_settings": redact_doc(output_settings(self.config))}
        ledger = Ledger.open(self.run_dir, settings_hash=self.state.settings_hash, meta=meta,
                             allow_mixed=self.allow_mixed, samples=self.config.sampling.n,
                             other_job=change.refusal() if change is not None else None)
        if change is not None and ledger.replaced is not None:
            self.taken = change.taken(ledger.replaced)
            log.info("%s", self.taken)
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
            self.state.requeued += count
        ingested = ledger.ingest_state()
        if not ingested["complete"]:
            # The first batch now, before any launch: a dataset that cannot be read fails here.
            self.records = iter_items(data, skip=ingested["rows"], models=batch_models(self.config))
            try:
                first = prepare_ingest(self.records, INGEST_BATCH, self.config.sampling.n)
                self._count_skips(first)
                self.first_batch = (first.rows, first.skipped)
                report = ledger.commit_ingest(first, resumed_from=ingested["rows"])
                self.first_rows = report.total_rows
                check_logprob_space(self.config, ledger, first, report, force=self.force)
            except BaseException:
                self.close_records()
                ledger.close()
                raise
            if ingested["rows"]:
                log.info("ingest resumed after row %d", ingested["rows"])
            if report.complete:
                self.close_records()
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
            before = known or {}
            why = ("[data] " + ", ".join(f"{k} {before.get(k)!r} -> {v!r}" for k, v in shape.items()
                                         if before.get(k) != v)) if changed else "--retry skipped"
            rows = ledger.ingest_state()["rows"]
            records = iter_items(data, models=batch_models(self.config))
            try:
                recovered, still = ledger.reread_skipped(itertools.islice(records, rows),
                                                         ("shape", "input"), reason=why)
            finally:
                with contextlib.suppress(ValueError):
                    records.close()  # type: ignore[attr-defined]
            log.info("skipped rows read again (%s): %d are now items to generate, %d still skipped",
                     why, recovered, still)
            self.state.requeued += recovered
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
        log.info("input: %s, %s unique, %s%s, %s skipped; %s", counted(report.total_rows, "row"),
                 f"{report.unique:,}", counted(report.duplicates, "duplicate"), conflicts, f"{report.skipped:,}",
                 describe_ids(self.config.data, report))
        if self._skip_reasons:
            reasons = sorted((SkipReason(c, r, n) for (c, r), n in self._skip_reasons.items()),
                             key=lambda r: -r.count)
            for line in describe_skips(reasons):
                log.warning("  %s", line)

    def first_batch_all_skipped(self, counts: dict[Status, int]) -> bool:
        """True when this session's first ingest batch was a whole batch, every row of it skipped,
        the dataset goes on, and nothing in the ledger waits to be generated."""
        rows, skipped = self.first_batch
        return (self.records is not None and rows >= INGEST_BATCH and skipped == rows
                and not counts[Status.PENDING] and not counts[Status.RUNNING])

    def _count_skips(self, batch: IngestBatch) -> None:
        for key, n in batch.skip_reasons.items():
            self._skip_reasons[key] = self._skip_reasons.get(key, 0) + n

    def close_records(self) -> None:
        """Stop reading the dataset: what is not committed is read again next session."""
        if self.records is not None:
            with contextlib.suppress(ValueError):  # still being read by a batch left to finish
                self.records.close()
            self.records = None

    def ingest_rest(self, writer: LedgerWriter, progress: Progress) -> None:
        """Start the ingest of the rest of the dataset (when the first batch did not hold it all)
        beside the launch and the dispatch; :meth:`finish` ends it."""
        if self.records is not None:
            progress.ingesting = True
            self._task = asyncio.create_task(self._ingest_rest(writer, progress))

    async def _ingest_rest(self, writer: LedgerWriter, progress: Progress) -> None:
        """Ingest the rest of the dataset, one batch per transaction through the writer; records
        are read and normalized on a worker thread."""
        records = self.records
        try:
            while not self._stop:
                batch: IngestBatch = await asyncio.to_thread(prepare_ingest, records, INGEST_BATCH,
                                                             self.config.sampling.n)
                if self._stop:
                    return  # not committed: the next session reads it again
                self._count_skips(batch)
                report = await writer.ingest(batch)
                progress.rows_read = report.total_rows
                progress.total = report.unique * self.config.sampling.n  # rows: one per sample
                progress.already_final += report.new_skipped * self.config.sampling.n  # final without any work
                self._ingested.set()
                if report.complete:
                    await asyncio.to_thread(self._log_input, report)  # it may read the ledger
                    progress.ingesting = False
                    return
        finally:
            self.close_records()
            self._ingested.set()

    def ingesting(self) -> bool:
        """True while the background ingest may still add items; raises what ended it, if anything did."""
        task = self._task
        if task is None:
            return False
        if not task.done():
            return True
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return False

    async def wait_ingested(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the next committed ingest batch (or the ingest's end)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._ingested.wait(), timeout)
        self._ingested.clear()

    async def finish(self) -> None:
        """Let the background ingest finish its current batch and stop (it resumes next session)."""
        task = self._task
        if task is None:
            return
        self._stop = True
        try:
            await asyncio.wait_for(asyncio.shield(task), INGEST_STOP_TIMEOUT)
        except asyncio.TimeoutError:
            log.warning("the ingest did not finish its batch within %.0f s; it resumes next time",
                        INGEST_STOP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - dispatch raises it where it looks; here it only ends
            log.warning("the ingest stopped: %s", exc)


__all__ = ["INGEST_BATCH", "Intake", "batch_models", "check_batch_sampling", "dataset_fingerprint", "describe_ids", "output_settings"]
