"""Where a run stands, read from its folder: counts by status, throughput, ETA, errors, the runner.

    st = run_status(run_dir)       # LedgerError when run_dir holds no readable ledger
    st.counts[Status.DONE], st.throughput.items_per_s, st.eta_s, st.runner.alive, st.totals.ok

Sources, and which wins:

- The ledger (``Ledger.open_readonly``) is the truth for counts, totals and failed items. Every
  ledger number comes from one read transaction, so the counts of a run being written still add up.
- ``progress.json`` (written by the runner every few seconds) gives the live rates when it is
  *fresh*: state ``running``, updated within ``stale_after_s``, and its pid alive. Otherwise the rate
  is measured from the results' ``created_at`` over the last ``window_s`` seconds. The file may be
  absent (a run that crashed before writing it): status then works from the ledger alone.
- Whether the runner is alive is *measured*: the recorded pid must exist, not be a zombie, and have
  been created no later than the recorded ``started_at`` (so a reused pid is never taken for the
  runner). Without progress.json (a run still ingesting, or one that crashed before writing it),
  the ledger's lock decides: /proc/locks must show it held, and the pid the lock file names is
  checked against the lock file's modification time the same way.

The throughput fallback reads the ledger's ``results`` table through the read-only ledger's own
connection (``Ledger.conn``, opened with ``query_only``); the ledger has no query for it. The scan
walks results newest-first by input order and is bounded (``_SCAN_MAX_ROWS``), so status stays fast
on a ledger of millions of results.

This module never writes to the run folder, never takes the ledger lock and never signals a
process: it only reads and measures.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from harvest.campaign.outputs.progress import PROGRESS_FILE
from harvest.dataset.skips import SkipReason
from harvest.ledger import LOCK_FILE, Ledger, Status, Totals

T = TypeVar("T")

#: Runner states progress.json records (shown as recorded; only ``running`` makes its rates live).
RUNNER_STATES = ("running", "finished", "interrupted", "failed", "server_down", "stopped")
#: A progress.json older than this (seconds) is not used for rates.
STALE_AFTER_S = 30.0
#: Seconds of results the ledger-based rate looks back over.
WINDOW_S = 600.0
#: A process created this many seconds after the recorded start is another process (clock slack).
_CREATE_SLACK_S = 2.0
#: Bounds of the newest-first scan of results for the ledger-based rate.
_SCAN_MAX_ROWS = 20_000
_SCAN_STOP_AFTER_OLD = 1_000


@dataclass(frozen=True)
class Progress:
    """What the runner last recorded in progress.json (fields it did not write are None / empty)."""

    started_at: float | None
    updated_at: float | None
    pid: int | None
    state: str | None
    done_this_session: int | None
    items_per_s: float | None
    gen_tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    in_flight: int | None
    errors_by_class: Mapping[str, int] = field(default_factory=dict)
    server_running: float | None = None
    server_waiting: float | None = None
    note: str | None = None
    #: ``concurrency = "auto"``: each endpoint's target when progress.json was written ({} when fixed).
    concurrency_targets: Mapping[str, int] = field(default_factory=dict)
    #: ... and why each target is where it is, in words ({} when fixed, or written before 2026-12-06).
    concurrency_reasons: Mapping[str, str] = field(default_factory=dict)
    #: Requests on the wire (``in_flight`` counts the items claimed, some waiting in harvest's queue).
    sent: int | None = None
    #: The engines' prefix-cache hit rate over the session (0..1), None when none reported it.
    prefix_cache_hit_rate: float | None = None
    #: Endpoints holding requests with nothing back for longer than their bound, as recorded:
    #: ``{"url", "quiet_s", "bound_s", "outstanding"}`` each.
    no_answer: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class RunnerInfo:
    """The runner process: what was recorded and what was measured now."""

    #: Pid checked, or None when no record names one.
    pid: int | None
    #: Measured: True the recorded process is alive, False it is gone (or the pid was reused),
    #: None when nothing records a runner (no progress.json, no lock file).
    alive: bool | None
    #: Where the pid came from: ``progress.json``, ``ledger.lock`` or None.
    source: str | None
    #: The state the runner recorded in progress.json (``running``, ``finished``, ...), if any.
    recorded_state: str | None
    #: One sentence for people, e.g. "pid 4242 alive, recorded state running".
    detail: str


@dataclass(frozen=True)
class Throughput:
    """Items and tokens per second, and where the numbers come from."""

    #: ``progress`` (the runner's fresh progress.json), ``ledger`` (results' created_at over the
    #: window) or ``none`` (no result in the window).
    source: str
    items_per_s: float | None
    gen_tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    #: For ``ledger``: the seconds the rate is measured over, and the results found in them.
    window_s: float | None = None
    results_in_window: int | None = None


@dataclass(frozen=True)
class ErrorEntry:
    """One failed item: id, error class, the server's message, attempts charged, where it came from."""

    item_id: str
    error_class: str
    message: str
    attempts: int
    source: str | None
    source_line: int | None


@dataclass(frozen=True)
class RunStatus:
    """Everything ``harvest status`` shows, measured at ``measured_at``."""

    run_dir: Path
    measured_at: float
    #: Items per status (every status present, zeros included); they add up to ``totals.unique``.
    counts: Mapping[Status, int]
    #: The end-of-run check (input rows, unique, duplicates, results, problems).
    totals: Totals
    #: Items with a final status / unique items.
    settled: int
    throughput: Throughput
    #: Seconds until pending + running items are settled at the current rate; 0.0 when nothing is
    #: left, None when unknown (no rate, or the runner is known to be gone).
    eta_s: float | None
    #: Failed items per error class (from the ledger) and the most recent failures.
    failed_by_class: Mapping[str, int]
    last_errors: tuple[ErrorEntry, ...]
    runner: RunnerInfo
    progress: Progress | None
    #: Meta recorded by the ledger.
    created_at: float | None
    settings_hashes: tuple[str, ...]
    harvest_version: str | None
    #: Things a person should know about how these numbers were read (unreadable progress.json, ...).
    notes: tuple[str, ...] = ()
    #: Why rows were skipped (error class, reason, count, an example row, a fix hint), most first.
    skip_reasons: tuple[SkipReason, ...] = ()
    #: The model the last session sent its requests to (checked against /v1/models), when recorded.
    model: str | None = None
    #: Samples per item (``[sampling] n``): the counts are of item rows, ``samples`` per input.
    samples: int = 1
    #: Top-k of the stored log-probabilities (0: none), and the shard bytes committed results cover.
    logprobs_k: int = 0
    logprob_bytes: int = 0
    logprob_shards: int = 0
    #: Streamed answers (``[client] stream``): ``{"ttft_s": {"p50", "p90", "p99", "mean", "n"},
    #: "tpot_s": ..., "itl_s": ...}`` over the run (timeline.json's histograms, to 2 %); None when
    #: nothing was streamed.
    token_timing: Mapping[str, Mapping[str, float | int | None]] | None = None

    @property
    def skipped(self) -> int:
        return self.counts[Status.SKIPPED]

    @property
    def remaining(self) -> int:
        """Items not settled yet: pending + running."""
        return self.counts[Status.PENDING] + self.counts[Status.RUNNING]


# ------------------------------------------------------------------------------------ progress.json


def _num(data: Mapping[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return kind(value)


def _of(data: Mapping[str, Any], key: str, kind: type[T]) -> T | None:
    """``data[key]`` when it is a ``kind`` (a file another process wrote may hold anything), else None."""
    value = data.get(key)
    return value if isinstance(value, kind) else None


def read_progress(run_dir: str | Path) -> tuple[Progress | None, str | None]:
    """progress.json of a run: ``(record, None)``, ``(None, None)`` when absent, or ``(None, why)``
    when it cannot be used. Unknown fields are ignored; missing ones are None."""
    path = Path(run_dir) / PROGRESS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path} unreadable: {exc}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"{path} is not JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object"
    errors = data.get("errors_by_class")
    if not isinstance(errors, dict):
        errors = {}
    errors = {str(k): int(v) for k, v in errors.items() if isinstance(v, int) and not isinstance(v, bool)}
    server = _of(data, "server", dict) or {}
    state = _of(data, "state", str)
    note = _of(data, "note", str)
    targets = {str(k): int(v) for k, v in (_of(data, "concurrency_targets", dict) or {}).items()
               if isinstance(v, int) and not isinstance(v, bool)}
    reasons = {str(k): v for k, v in (_of(data, "concurrency_reasons", dict) or {}).items() if isinstance(v, str)}
    cache = _of(data, "prefix_cache", dict) or {}
    quiet = _of(data, "no_answer", list) or []
    no_answer = tuple({"url": str(e["url"]), "quiet_s": float(e["quiet_s"]), "bound_s": float(e["bound_s"]),
                       "outstanding": int(e["outstanding"]), "hung": e.get("hung") is True} for e in quiet
                      if isinstance(e, dict) and all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)
                                                     for k in ("quiet_s", "bound_s", "outstanding"))
                      and isinstance(e.get("url"), str))
    return Progress(
        started_at=_num(data, "started_at", float), updated_at=_num(data, "updated_at", float),
        pid=_num(data, "pid", int), state=state, done_this_session=_num(data, "done_this_session", int),
        items_per_s=_num(data, "items_per_s", float), gen_tokens_per_s=_num(data, "gen_tokens_per_s", float),
        prompt_tokens_per_s=_num(data, "prompt_tokens_per_s", float), in_flight=_num(data, "in_flight", int),
        errors_by_class=errors, server_running=_num(server, "running", float),
        server_waiting=_num(server, "waiting", float), note=note, concurrency_targets=targets,
        concurrency_reasons=reasons,
        sent=_num(data, "sent", int),
        prefix_cache_hit_rate=_num(cache, "hit_rate", float), no_answer=no_answer,
    ), None


# ------------------------------------------------------------------------------------ the runner


def process_alive(pid: int, *, started_by: float) -> tuple[bool, str]:
    """Is ``pid`` a live process created no later than ``started_by`` (epoch seconds)? Also why.

    A process created after ``started_by`` holds a reused pid: it is not the one recorded. Only
    reads /proc through psutil; never signals.
    """
    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
        zombie = proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False, f"pid {pid} is gone"
    except psutil.AccessDenied:
        # It exists; its start time is hidden from us. Say so rather than guess either way.
        return True, f"pid {pid} exists (its start time is not readable here)"
    if zombie:
        return False, f"pid {pid} has exited (zombie)"
    if created > started_by + _CREATE_SLACK_S:
        return False, f"pid {pid} now belongs to another process (created after the run started)"
    return True, f"pid {pid} alive"


def _lock_held(lock: Path) -> bool | None:
    """Does any process hold an flock on ``lock``? Read from /proc/locks (Linux); None when that
    cannot be read. Reading never takes or disturbs the lock."""
    try:
        inode = lock.stat().st_ino
        lines = Path("/proc/locks").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146643 0 EOF" (blocked waiters carry a "->" field)
        if "FLOCK" in parts and "->" not in parts:
            where = next((p for p in parts if p.count(":") == 2), "")
            if where.rsplit(":", 1)[-1] == str(inode):
                return True
    return False


def _runner(run_dir: Path, progress: Progress | None) -> RunnerInfo:
    if progress is not None and progress.pid is not None:
        started = progress.started_at if progress.started_at is not None else progress.updated_at
        if started is None:
            return RunnerInfo(progress.pid, None, PROGRESS_FILE, progress.state,
                              f"pid {progress.pid} recorded without a start time (not checked),"
                              f" recorded state {progress.state}")
        alive, why = process_alive(progress.pid, started_by=started)
        return RunnerInfo(pid=progress.pid, alive=alive, source=PROGRESS_FILE,
                          recorded_state=progress.state, detail=f"{why}, recorded state {progress.state}")
    # No progress.json (a run still ingesting, or one that crashed before writing it): the ledger's
    # lock file names the last process that opened the run for writing. It wrote its pid when it
    # took the lock, so that process was created before the file's mtime; and while it runs, it
    # holds the lock.
    lock = run_dir / LOCK_FILE
    try:
        text = lock.read_text(encoding="ascii", errors="replace").strip()
        mtime = lock.stat().st_mtime
    except OSError:
        return RunnerInfo(None, None, None, None, "no runner recorded (no progress.json, no lock file)")
    if not text.isdigit():
        return RunnerInfo(None, None, None, None,
                          "no runner recorded (no progress.json; the lock file names no pid)")
    pid = int(text)
    if _lock_held(lock) is False:
        return RunnerInfo(pid, False, LOCK_FILE, None,
                          f"no process holds the ledger lock (pid {pid} opened the run last);"
                          " no progress.json")
    alive, why = process_alive(pid, started_by=mtime)
    return RunnerInfo(pid, alive, LOCK_FILE, None, f"{why} (named by the ledger lock; no progress.json)")


# ------------------------------------------------------------------------------------ rates


@contextlib.contextmanager
def _snapshot(ledger: Ledger) -> Iterator[None]:
    """One read transaction: every query inside sees the same state of a ledger being written."""
    conn = ledger.conn
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def ledger_rate(ledger: Ledger, *, now: float, window_s: float = WINDOW_S,
                started_at: float | None = None) -> Throughput:
    """Results per second (and tokens per second) over the last ``window_s`` seconds, from the
    results' ``created_at``. Bounded scan, newest first by input order (see the module docstring).

    The span is ``now`` minus the later of the window start and ``started_at`` (the session start,
    when known), else minus the oldest result found in the window; when the scan is cut short, the
    span of the results it read.
    """
    cutoff = now - window_s
    cur = ledger.conn.execute(
        "SELECT created_at, prompt_tokens, completion_tokens FROM results ORDER BY item DESC")
    n = prompt = completion = 0
    oldest: float | None = None
    old_run = scanned = 0
    capped = False
    try:
        while True:
            rows = cur.fetchmany(500)
            if not rows:
                break
            for created, p, c in rows:
                scanned += 1
                if created >= cutoff:
                    n += 1
                    prompt += _tokens(p)
                    completion += _tokens(c)
                    oldest = created if oldest is None else min(oldest, created)
                    old_run = 0
                else:
                    old_run += 1
            if old_run >= _SCAN_STOP_AFTER_OLD:
                break
            if scanned >= _SCAN_MAX_ROWS:
                capped = True
                break
    finally:
        cur.close()
    if n == 0 or oldest is None:
        return Throughput("none", None, None, None, window_s=window_s, results_in_window=0)
    if capped:
        start = oldest
    elif started_at is not None:
        start = max(cutoff, min(started_at, oldest))
    else:
        start = oldest
    span = max(now - start, 1.0)
    return Throughput("ledger", n / span, completion / span, prompt / span, window_s=span,
                      results_in_window=n)


def _tokens(value: Any) -> int:
    """A stored token count as a rate counts it: a ledger written by another version, or by hand,
    may hold anything; only an integer in range counts (else 0, as an unknown count)."""
    return value if type(value) is int and 0 <= value < 2**31 else 0


def _progress_fresh(progress: Progress | None, runner: RunnerInfo, now: float, stale_after_s: float) -> bool:
    return (progress is not None and progress.state == "running" and runner.alive is True
            and progress.updated_at is not None and now - progress.updated_at <= stale_after_s
            and progress.items_per_s is not None)


# ------------------------------------------------------------------------------------ run_status


def run_status(run_dir: str | Path, *, now: float | None = None, window_s: float = WINDOW_S,
               stale_after_s: float = STALE_AFTER_S, errors_limit: int = 10) -> RunStatus:
    """Read where the run in ``run_dir`` stands. Raises :class:`~harvest.errors.LedgerError` when the
    folder holds no readable harvest ledger (the message names the path)."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    notes: list[str] = []
    progress, problem = read_progress(run_dir)
    if problem:
        notes.append(f"{problem}; rates come from the ledger")
    runner = _runner(run_dir, progress)
    ledger = Ledger.open_readonly(run_dir)
    try:
        with _snapshot(ledger):
            totals = ledger.check_totals()
            failed_by_class, recent = ledger.errors(errors_limit)
            skip_reasons = tuple(ledger.skip_reasons())
            meta = ledger.meta()
            lp_shards, lp_bytes = ledger.logprob_usage()
            samples = ledger.samples
            if _progress_fresh(progress, runner, now, stale_after_s):
                assert progress is not None
                throughput = Throughput("progress", progress.items_per_s, progress.gen_tokens_per_s,
                                        progress.prompt_tokens_per_s)
            else:
                started = progress.started_at if progress is not None else None
                throughput = ledger_rate(ledger, now=now, window_s=window_s, started_at=started)
    finally:
        ledger.close()
    counts = dict(totals.counts)
    remaining = counts[Status.PENDING] + counts[Status.RUNNING]
    if remaining == 0 and totals.ingest_complete:
        eta: float | None = 0.0
    elif runner.alive is False or not throughput.items_per_s:
        eta = None
    else:
        eta = remaining / throughput.items_per_s
    if progress is not None and progress.state == "running" and runner.alive is False:
        notes.append("progress.json says running but the runner is gone: the run was killed or crashed;"
                     " resume it with harvest run")
    if not totals.ingest_complete:
        notes.append("the input is not fully ingested yet: totals and ETA cover what was read so far")
    errors = tuple(ErrorEntry(item_id=r.item_id, error_class=r.error_class or "?",
                              message=r.last_error or "", attempts=r.attempts, source=r.source,
                              source_line=r.source_line) for r in recent)
    hashes = meta.get("settings_hashes") or ([meta["settings_hash"]] if meta.get("settings_hash") else [])
    return RunStatus(
        run_dir=run_dir, measured_at=now, counts=counts, totals=totals,
        settled=sum(counts[s] for s in (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED)),
        throughput=throughput, eta_s=eta, failed_by_class=dict(failed_by_class), last_errors=errors,
        runner=runner, progress=progress, created_at=_num(meta, "created_at", float),
        settings_hashes=tuple(str(h) for h in hashes),
        harvest_version=meta.get("harvest_version") if isinstance(meta.get("harvest_version"), str) else None,
        notes=tuple(notes), skip_reasons=skip_reasons,
        model=meta.get("model_used") if isinstance(meta.get("model_used"), str) else None,
        samples=samples, logprobs_k=_logprobs_k(meta), logprob_bytes=lp_bytes,
        logprob_shards=lp_shards, token_timing=token_timing(run_dir),
    )


def token_timing(run_dir: Path) -> dict[str, dict[str, float | int | None]] | None:
    """TTFT, TPOT and ITL quantiles of the run's streamed answers, from timeline.json (None: none)."""
    from harvest.campaign.outputs.timeline import STREAM_NAMES, histograms, read_timeline

    doc, _ = read_timeline(run_dir)
    if doc is None:
        return None
    hs = histograms(doc)
    out = {name: {"p50": hs[name].quantile(0.5), "p90": hs[name].quantile(0.9), "p99": hs[name].quantile(0.99),
                  "mean": round(hs[name].sum / hs[name].n, 6), "n": hs[name].n}
           for name in STREAM_NAMES if hs[name].n}
    return out or None


def _logprobs_k(meta: Mapping[str, Any]) -> int:
    """``[sampling] logprobs`` of the run's recorded job (0 when none or unreadable)."""
    job = meta.get("job")
    sampling = job.get("sampling") if isinstance(job, Mapping) else None
    k = sampling.get("logprobs") if isinstance(sampling, Mapping) else None
    return k if isinstance(k, int) else 0


__all__ = [
    "ErrorEntry", "Progress", "RUNNER_STATES", "RunStatus", "RunnerInfo", "STALE_AFTER_S", "Throughput",
    "WINDOW_S", "ledger_rate", "process_alive", "read_progress", "run_status",
]
