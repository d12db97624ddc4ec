"""Progress of a running campaign: phases, rates, ETA, the server's queue, errors by class.

One :class:`Progress` per run. The runner feeds it counts and the supervisor its phases (through
:attr:`Progress.on_event`); it writes ``progress.json`` (atomically) for ``harvest status`` in
another shell, feeds the timeline, and tells whoever watches the run (a :class:`RunWatch`: the
command line's panel) each event and each snapshot, so the display is drawn from these alone. It
renders nothing, never reads the ledger and never blocks the event loop on anything slower than a
small file write.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harvest import safefiles
from harvest.events import Event, Phases
from harvest.redact import redact_doc

PROGRESS_FILE = "progress.json"

log = logging.getLogger("harvest.campaign")


@dataclass(frozen=True)
class ProgressView:
    """What a display may show of a run at one moment: ``snap`` is progress.json's document
    (:meth:`Progress.snapshot`); the rest is what the file leaves out."""

    run_dir: Path
    snap: dict[str, Any]
    #: Final items by status before this session's work (the file has their sum only).
    before: Mapping[str, int] = field(default_factory=dict)
    #: The dataset being read, for a display that shows how far the ingest is into it.
    data_path: str | None = None
    #: Seconds the rates are measured over.
    window_s: float = 60.0


class RunWatch(Protocol):
    """Who shows a run while it goes (``harvest run``'s panel): fed by the session's phase events
    and the progress snapshots only, from the session's threads."""

    def opened(self, look: Callable[[], ProgressView]) -> None:
        """The session's display begins; ``look()`` gives a fresh view whenever it redraws (any thread)."""

    def on_event(self, event: Event) -> None:
        """A phase started, changed or ended (any thread)."""

    def updated(self, view: ProgressView) -> None:
        """progress.json was written with ``view.snap`` (every ``[run] progress_interval``, and at
        the end)."""

    def closed(self) -> None:
        """The session's display ends (its last state may stay on screen)."""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (mode 0600)."""
    safefiles.write_atomic(path, json.dumps(redact_doc(data), indent=1, sort_keys=True), fsync=False)


class Progress:
    """Counts and rates of one run, with progress.json and whoever watches it."""

    def __init__(self, run_dir: Path | safefiles.Folder, *, total: int, already_final: int,
                 window_s: float = 60.0, data_path: str | None = None,
                 before: Mapping[str, int] | None = None, watch: RunWatch | None = None):
        #: The held run folder progress.json is written in (a path: by name, for a status view).
        self.folder = run_dir if isinstance(run_dir, safefiles.Folder) else None
        self.run_dir = run_dir.path if isinstance(run_dir, safefiles.Folder) else run_dir
        self.total = total
        #: Final items by status before this session's work (rows skipped at ingest join "skipped").
        self.before: Counter[str] = Counter(before or {})
        self._final_unknown = 0 if before is not None else already_final
        self.data_path = data_path
        self._data_size = _file_size(data_path)
        #: The phases (ingest, preflight, launching, generating, stopping) as reported.
        self.phases = Phases()
        #: The display told of every event and snapshot (None: nothing is shown).
        self.watch = watch
        self._lock = threading.RLock()
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.done = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.in_flight = 0
        self.errors: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.server: dict[str, float | None] = {"running": None, "waiting": None}
        #: ``concurrency = "auto"``: each endpoint's current target (url -> requests); {} when fixed.
        self.concurrency: dict[str, int] = {}
        #: The same, why each target is where it is (url -> words: "engine capacity 4 from /props").
        self.concurrency_reasons: dict[str, str] = {}
        #: The same per endpoint (URL -> {"running", "waiting"}), shown when there are several.
        self.server_endpoints: dict[str, dict[str, float | None]] = {}
        #: The engines' prefix-cache hit rate over this session (``PrefixCacheMeter.snapshot``); {}
        #: while no engine reported one.
        self.prefix_cache: dict[str, float | None] = {}
        self.state = "running"
        self.note: str | None = None
        self._ingesting = False
        self._rows_read: int | None = None
        self._window: deque[tuple[float, int, int, int]] = deque()
        self._window_s = window_s
        #: The run's timeline recorder (harvest.campaign.outputs.timeline), fed beside the counts; optional.
        self.timeline: Any = None
        #: harvest's own /metrics (``campaign/outputs/prometheus.py``), fed beside it; None when off.
        self.metrics: Any = None
        #: ``time.monotonic()`` of the last :meth:`update` (progress.json written).
        self.last_update = time.monotonic()
        #: The client's ``stats`` (a callable returning ClientStats) while requests go out: what is
        #: *sent* (on the wire), as opposed to ``in_flight`` (claimed from the ledger, some of them
        #: still waiting in harvest's own queue for a slot).
        self.client_stats: Any = None
        #: ``[client] health_deadline``: how long a sick endpoint may take before the run gives up.
        self.health_deadline: float | None = None
        #: ``[client] hang_deadline`` and the endpoints of the servers harvest launched (normalized
        #: URLs): a managed endpoint that stops answering is relaunched after that bound instead.
        self.hang_deadline: float | None = None
        self.managed: frozenset[str] = frozenset()
        #: True from a relaunch's start until dispatch resumes (the phases say it).
        self._relaunching = False
        #: Seconds items waited in harvest's own queue (claimed, not yet sent), this session.
        self.queue_wait_s = 0.0
        #: The client's fixed concurrency (None with "auto": see ``concurrency`` targets).
        self.concurrency_limit: int | None = None
        #: Streamed answers (``[client] stream``): the latest items' TTFT and TPOT, and the latest
        #: gaps between their tokens (ITL), seconds.
        self.ttft_recent: deque[float] = deque(maxlen=STREAM_RECENT)
        self.tpot_recent: deque[float] = deque(maxlen=STREAM_RECENT)
        self.itl_recent: deque[float] = deque(maxlen=ITL_RECENT)
        #: Where progress.json's writes go: None writes on the caller's thread; a session running in
        #: an event loop hands its one file-writer thread (the loop never waits on the disk).
        self.defer: Callable[[Callable[[], None]], Any] | None = None
        self._write_failed = False

    # --- phases ----------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """The listener the runner and the supervisor report phases through (any thread)."""
        self.phases.on_event(event)
        if event.kind == "start" and event.phase == "generating":
            with self._lock:  # rates count from here, not from the launch's idle minutes
                self._window.clear()
                self._t0 = time.monotonic()
                self._window.append((self._t0, self.done, self.prompt_tokens, self.completion_tokens))
        elif event.kind == "start" and event.phase == "stopping":
            self.server, self.server_endpoints = {"running": None, "waiting": None}, {}
        if event.phase == "generating":  # a relaunch pauses generation: from its end to the next start
            self._relaunching = event.kind == "end" and event.info.get("outcome") == "relaunching"
        if self.watch is not None:
            self.watch.on_event(event)

    def begin(self, phase: str, **info: Any) -> None:
        self.on_event(Event(phase, "start", info))

    def ingest_began(self, at: float, rows: int | None, *, ongoing: bool) -> None:
        """The ingest of this session began at ``at`` (monotonic) and has read ``rows`` so far;
        ``ongoing`` when it goes on beside the launch. Nothing is shown when it read nothing."""
        if rows is None:
            return
        self._rows_read = rows
        self.on_event(Event("ingest", "start", {"rows": rows, "size": self._data_size}, at=at))
        if ongoing:
            self._ingesting = True
        else:
            self.on_event(Event("ingest", "end", {"rows": rows}))

    @property
    def ingesting(self) -> bool:
        """True while the dataset is still being ingested (``total`` grows with it)."""
        return self._ingesting

    @ingesting.setter
    def ingesting(self, value: bool) -> None:
        if value and not self._ingesting:
            self.on_event(Event("ingest", "start", {"rows": self._rows_read, "size": self._data_size}))
        elif not value and self._ingesting:
            self.on_event(Event("ingest", "end", {"rows": self._rows_read}))
        self._ingesting = value

    @property
    def rows_read(self) -> int | None:
        """Input rows read so far (all sessions), as the ingest reports them."""
        return self._rows_read

    @rows_read.setter
    def rows_read(self, value: int) -> None:
        self._rows_read = value
        self.on_event(Event("ingest", "update", {"rows": value}))

    @property
    def already_final(self) -> int:
        """Items final before this session's work: earlier sessions' results and skipped rows."""
        return sum(self.before.values()) + self._final_unknown

    @already_final.setter
    def already_final(self, value: int) -> None:
        # Only the ingest adds to it during a session, with the rows it skipped (final unworked).
        self.before["skipped"] += value - self.already_final

    # --- feeding ---------------------------------------------------------------------------------

    def record(self, status: str, prompt_tokens: int = 0, completion_tokens: int = 0,
               latency_s: float | None = None, queue_s: float | None = None) -> None:
        """One item reached ``status``; ``latency_s`` from its requests being sent, ``queue_s`` its
        wait in harvest's own queue before that."""
        with self._lock:
            self._record(status, prompt_tokens, completion_tokens, latency_s, queue_s)

    def _record(self, status: str, prompt_tokens: int, completion_tokens: int,
                latency_s: float | None, queue_s: float | None = None) -> None:
        self.done += 1
        self.statuses[status] += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if queue_s is not None:
            self.queue_wait_s += queue_s
        if self.timeline is not None:
            self.timeline.item(status, latency_s, prompt_tokens, completion_tokens, queue_s)
        if self.metrics is not None:
            self.metrics.item(status, prompt_tokens, completion_tokens, latency_s)

    def stream_times(self, ttft_s: float | None, tpot_s: float | None, itl_s: Sequence[float]) -> None:
        """A streamed item's time to first token, per output token and its inter-token gaps: kept for
        the panel's row and ``progress.json`` (recent ones), and binned in the timeline."""
        with self._lock:
            if ttft_s is not None:
                self.ttft_recent.append(ttft_s)
            if tpot_s is not None:
                self.tpot_recent.append(tpot_s)
            self.itl_recent.extend(itl_s)
            if self.timeline is not None:
                self.timeline.stream_times(ttft_s, tpot_s, itl_s)
            if self.metrics is not None:
                self.metrics.stream_times(ttft_s, tpot_s)

    def error(self, error_class: str) -> None:
        with self._lock:  # the display's thread copies the counters under the same lock
            self.errors[error_class] += 1
        if self.metrics is not None:
            self.metrics.error(error_class)

    # --- rates -----------------------------------------------------------------------------------

    def rates(self) -> dict[str, float]:
        """Items/s and tokens/s over the last ``window_s`` seconds."""
        with self._lock:
            return self._rates()

    def _rates(self) -> dict[str, float]:
        now = time.monotonic()
        self._window.append((now, self.done, self.prompt_tokens, self.completion_tokens))
        while len(self._window) > 2 and now - self._window[0][0] > self._window_s:
            self._window.popleft()
        t, d, p, c = self._window[0]
        span = now - t
        if span <= 0:
            span = max(now - self._t0, 1e-9)
            t, d, p, c = self._t0, 0, 0, 0
        return {"items_per_s": (self.done - d) / span, "prompt_tokens_per_s": (self.prompt_tokens - p) / span,
                "gen_tokens_per_s": (self.completion_tokens - c) / span}

    def snapshot(self) -> dict[str, Any]:
        rates = self.rates()
        remaining = max(self.total - self.already_final - self.done, 0)
        stats = self.client_stats() if self.client_stats is not None and self.state == "running" else None
        client = self._client_view(stats)
        stalled = self._stalled(client, stats)
        # No ETA while nothing comes back: the rate of the last minute says nothing of when it will.
        eta = remaining / rates["items_per_s"] if rates["items_per_s"] > 0 and not self.ingesting \
            and stalled is None else None
        return {
            "started_at": self.started_at, "updated_at": time.time(), "pid": os.getpid(), "state": self.state,
            "note": self.note, "total": self.total, "ingesting": self.ingesting,
            "final_before_session": self.already_final, "final_before_by_status": dict(self.before),
            "done_this_session": self.done, "in_flight": self.in_flight, "eta_s": eta, "stalled": stalled,
            **client,
            "statuses_this_session": dict(self.statuses), "errors_by_class": dict(self.errors),
            "server": dict(self.server),
            "concurrency_targets": dict(self.concurrency),
            "concurrency_reasons": dict(self.concurrency_reasons),
            "concurrency": self.concurrency_limit,
            "server_endpoints": dict(self.server_endpoints),
            "prefix_cache": dict(self.prefix_cache),
            "stream": stream_view(self.ttft_recent, self.tpot_recent, self.itl_recent),
            "phases": self.phases.active(),
            "phase_states": phase_states(self.phases),
            **{k: round(v, 3) for k, v in rates.items()},
        }

    def _stalled(self, client: Mapping[str, Any], stats: Any) -> str | None:
        """Why nothing comes back now (a relaunch under way; every endpoint holding requests with
        nothing back past its bound, or sick), else None."""
        if self.state != "running":
            return None
        if self._relaunching:
            return "the server is being relaunched"
        if stats is None or not stats.endpoints:
            return None
        quiet = {e["url"] for e in client["no_answer"]} | {e["url"] for e in client["sick"]}
        if quiet and all(e.url in quiet for e in stats.endpoints):
            first = (client["no_answer"] or client["sick"])[0]
            return first.get("last_error") or f"no answer for {first.get('quiet_s') or 0:.0f} s"
        return None

    def _client_view(self, stats: Any) -> dict[str, Any]:
        """``sent`` (requests on the wire), ``queued`` (claimed, waiting in harvest for a slot),
        ``concurrency``, ``sick`` endpoints with the seconds waited and the deadline, and the mean
        queue wait of the items finished this session."""
        out: dict[str, Any] = {"sent": None, "queued": None, "sick": [], "no_answer": [],
                               "queue_wait_s_mean": round(self.queue_wait_s / self.done, 3) if self.done else None}
        if stats is None:  # the client's stats (ClientStats), or None when no client sends
            if self.state != "running":
                out["sent"], out["queued"] = 0, 0
            return out
        out["sent"] = stats.in_flight
        out["queued"] = max(self.in_flight - stats.in_flight, 0)
        now = time.monotonic()
        for e in stats.endpoints:
            managed = e.url in self.managed
            if e.hung and e.state.value in ("healthy", "hung"):
                # holding requests and sending nothing back (found hung: no new requests to it either)
                out["no_answer"].append({"url": e.url, "quiet_s": e.quiet_s, "bound_s": e.hung_after_s,
                                         "outstanding": e.outstanding, "hung": e.state.value == "hung",
                                         "managed": managed, "last_error": e.last_error if e.hung_s else None})
            elif e.state.value != "healthy" and e.failing_since is not None:
                # a managed server is relaunched after hang_deadline; one harvest does not own is given
                # up after health_deadline
                out["sick"].append({"url": e.url, "state": "relaunching" if self._relaunching else e.state.value,
                                    "waited_s": round(now - e.failing_since, 1), "managed": managed,
                                    "deadline_s": self.hang_deadline if managed else self.health_deadline,
                                    "deadline_name": "hang_deadline" if managed else "health_deadline",
                                    "last_error": e.last_error})
        return out

    # --- output ----------------------------------------------------------------------------------

    def view(self, snap: dict[str, Any] | None = None) -> ProgressView:
        """``snap`` (a fresh snapshot when None) with what a display needs beside it."""
        with self._lock:
            return ProgressView(self.run_dir, self.snapshot() if snap is None else snap, dict(self.before),
                                self.data_path, self._window_s)

    def update(self) -> dict[str, Any]:
        """Write progress.json, feed the timeline and /metrics, tell the watch; returns the snapshot."""
        self.last_update = time.monotonic()
        snap = self.snapshot()
        if self.metrics is not None:
            self.metrics.observe(snap, self.client_stats() if self.client_stats is not None else None)
        text = json.dumps(redact_doc(snap), indent=1, sort_keys=True)
        folder, path = self.folder, self.run_dir / PROGRESS_FILE

        def write() -> None:
            try:
                if folder is not None:
                    folder.write_atomic(PROGRESS_FILE, text, fsync=False)
                else:
                    safefiles.write_atomic(path, text, fsync=False)
                self._write_failed = False
            except OSError as exc:  # a full disk must not end the run here; the ledger write will say so
                if not self._write_failed:
                    log.warning("progress.json not written: %s", exc)
                self._write_failed = True

        if self.defer is not None:
            self.defer(write)
        else:
            write()
        if self.timeline is not None:
            self.timeline.interval(snap)
        if self.watch is not None:
            self.watch.updated(self.view(snap))
        return snap

    def __enter__(self) -> Progress:
        if self.watch is not None:
            self.watch.opened(self.view)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ingesting:  # the session ends before the ingest did: it resumes next time
            self._ingesting = False
            self.on_event(Event("ingest", "end", {"rows": self._rows_read}, ok=False))
        if self.watch is not None:
            self.watch.closed()


#: Streamed items whose TTFT and TPOT the panel and progress.json summarize (the latest ones).
STREAM_RECENT = 2048
#: Gaps between tokens (ITL) they summarize (the latest ones, of the latest items).
ITL_RECENT = 8192


def phase_states(phases: Phases) -> list[dict[str, Any]]:
    """The phases as progress.json keeps them, for a display in another process (``harvest status
    --watch``): name, start and end as epoch seconds, how it ended, its info (JSON values only)."""
    offset = time.time() - time.monotonic()
    out = []
    for p in phases.states():
        info = json.loads(json.dumps(p.info, default=str))
        out.append({"name": p.name, "started_at": round(p.started + offset, 3),
                    "ended_at": None if p.ended is None else round(p.ended + offset, 3), "ok": p.ok, "info": info})
    return out


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    pick = [ordered[min(int(q * len(ordered)), len(ordered) - 1)] for q in (0.5, 0.9, 0.99)]
    return {"p50": round(pick[0], 6), "p90": round(pick[1], 6), "p99": round(pick[2], 6), "n": len(ordered)}


def stream_view(ttft: Sequence[float], tpot: Sequence[float], itl: Sequence[float] = ()) -> dict[str, Any] | None:
    """``{"ttft_s": {p50, p90, p99, n}, "tpot_s": {...}, "itl_s": {...}}`` of the latest streamed
    items (ITL: their latest gaps between tokens); None when nothing was streamed."""
    if not ttft and not tpot:
        return None
    return {"ttft_s": _quantiles(list(ttft)), "tpot_s": _quantiles(list(tpot)), "itl_s": _quantiles(list(itl))}


def _file_size(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        p = Path(path)
        return p.stat().st_size if p.is_file() else None
    except OSError:
        return None


__all__ = ["PROGRESS_FILE", "Progress", "ProgressView", "RunWatch", "STREAM_RECENT", "phase_states", "stream_view",
           "write_json_atomic"]
