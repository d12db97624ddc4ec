"""Progress of a running campaign: phases, rates, ETA, the server's queue, errors by class.

One :class:`Progress` per run. The runner feeds it counts and the supervisor its phases (through
:attr:`Progress.on_event`); it renders a rich live panel on a terminal (the phases with their
elapsed time, a progress bar, the rates; redrawn a few times a second, so elapsed times grow while
nothing else moves), plain periodic log lines elsewhere, and writes ``progress.json`` (atomically)
for ``harvest status`` in another shell. Anything else printed while the panel is up must go
through :attr:`Progress.console` (it lands above the panel). It never reads the ledger and never
blocks the event loop on anything slower than a small file write.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from harvest import safefiles
from harvest.campaign.outputs.phases import PhaseBoard
from harvest.events import Event
from harvest.redact import as_text, redact_doc

PROGRESS_FILE = "progress.json"
#: Widest the live panel is drawn (narrower terminals get their width): a fixed frame, not one
#: that jumps with the length of its longest line.
PANEL_WIDTH = 120
#: The panel's label column: its longest label ("endpoint").
LABEL_WIDTH = 8


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (mode 0600)."""
    safefiles.write_atomic(path, json.dumps(redact_doc(data), indent=1, sort_keys=True), fsync=False)


class Progress:
    """Counts and rates of one run, with a live display and progress.json."""

    def __init__(self, run_dir: Path | safefiles.Folder, *, total: int, already_final: int,
                 stream: TextIO | None = None, live: bool | None = None, window_s: float = 60.0,
                 console: Console | None = None, data_path: str | None = None,
                 before: Mapping[str, int] | None = None):
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
        self.phases = PhaseBoard()
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
        if console is None:
            stream = stream or sys.stderr
            console = Console(file=stream, stderr=stream is sys.stderr, soft_wrap=True)
        #: Print through this while the panel is up: the lines go above it, never into it.
        self.console = console
        self._console = console
        self._live_enabled = self._console.is_terminal if live is None else live
        self._live: Live | None = None
        #: The run's timeline recorder (harvest.campaign.outputs.timeline), fed beside the counts; optional.
        self.timeline: Any = None
        #: The client's ``stats`` (a callable returning ClientStats) while requests go out: what is
        #: *sent* (on the wire), as opposed to ``in_flight`` (claimed from the ledger, some of them
        #: still waiting in harvest's own queue for a slot).
        self.client_stats: Any = None
        #: ``[client] health_deadline``: how long a sick endpoint may take before the run gives up.
        self.health_deadline: float | None = None
        #: Seconds items waited in harvest's own queue (claimed, not yet sent), this session.
        self.queue_wait_s = 0.0
        #: The client's fixed concurrency (None with "auto": see ``concurrency`` targets).
        self.concurrency_limit: int | None = None
        #: Streamed answers (``[client] stream``): the latest items' TTFT and TPOT, seconds.
        self.ttft_recent: deque[float] = deque(maxlen=STREAM_RECENT)
        self.tpot_recent: deque[float] = deque(maxlen=STREAM_RECENT)

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
        if not self._live_enabled and (event.kind != "update" or event.phase == "launching"):
            row = next((r for r in self.phases.rows() if r.name == event.phase), None)
            if row is not None:  # off a terminal: a line per phase change, as a log would have it
                self._console.print(f"[harvest] {row.name} ({row.elapsed_s:.1f} s): {row.text}",
                                    markup=False, highlight=False)

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
        self.phases.on_event(Event("ingest", "update", {"rows": value}))

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

    def stream_times(self, ttft_s: float | None, tpot_s: float | None, itl_s: Sequence[float]) -> None:
        """A streamed item's time to first token, per output token and its inter-token gaps: kept for
        the panel's row and ``progress.json`` (recent ones), and binned in the timeline."""
        with self._lock:
            if ttft_s is not None:
                self.ttft_recent.append(ttft_s)
            if tpot_s is not None:
                self.tpot_recent.append(tpot_s)
            if self.timeline is not None:
                self.timeline.stream_times(ttft_s, tpot_s, itl_s)

    def error(self, error_class: str) -> None:
        with self._lock:  # the display's thread copies the counters under the same lock
            self.errors[error_class] += 1

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
        eta = remaining / rates["items_per_s"] if rates["items_per_s"] > 0 and not self.ingesting else None
        return {
            "started_at": self.started_at, "updated_at": time.time(), "pid": os.getpid(), "state": self.state,
            "note": self.note, "total": self.total, "ingesting": self.ingesting,
            "final_before_session": self.already_final,
            "done_this_session": self.done, "in_flight": self.in_flight, "eta_s": eta,
            **self._client_view(),
            "statuses_this_session": dict(self.statuses), "errors_by_class": dict(self.errors),
            "server": dict(self.server),
            "concurrency_targets": dict(self.concurrency),
            "concurrency": self.concurrency_limit,
            "server_endpoints": dict(self.server_endpoints),
            "prefix_cache": dict(self.prefix_cache),
            "stream": stream_view(self.ttft_recent, self.tpot_recent),
            "phases": [r.name for r in self.phases.rows() if r.active],
            **{k: round(v, 3) for k, v in rates.items()},
        }

    def _client_view(self) -> dict[str, Any]:
        """``sent`` (requests on the wire), ``queued`` (claimed, waiting in harvest for a slot),
        ``concurrency``, ``sick`` endpoints with the seconds waited and the deadline, and the mean
        queue wait of the items finished this session."""
        out: dict[str, Any] = {"sent": None, "queued": None, "sick": [], "no_answer": [],
                               "queue_wait_s_mean": round(self.queue_wait_s / self.done, 3) if self.done else None}
        stats = self.client_stats() if self.client_stats is not None and self.state == "running" else None
        if stats is None:
            if self.state != "running":
                out["sent"], out["queued"] = 0, 0
            return out
        out["sent"] = stats.in_flight
        out["queued"] = max(self.in_flight - stats.in_flight, 0)
        now = time.monotonic()
        for e in stats.endpoints:
            if e.hung and e.state.value in ("healthy", "hung"):
                # holding requests and sending nothing back (found hung: no new requests to it either)
                out["no_answer"].append({"url": e.url, "quiet_s": e.quiet_s, "bound_s": e.hung_after_s,
                                         "outstanding": e.outstanding, "hung": e.state.value == "hung"})
            elif e.state.value != "healthy" and e.failing_since is not None:
                out["sick"].append({"url": e.url, "state": e.state.value, "waited_s": round(now - e.failing_since, 1),
                                    "deadline_s": self.health_deadline, "last_error": e.last_error})
        return out

    # --- output ----------------------------------------------------------------------------------

    def update(self) -> dict[str, Any]:
        """Write progress.json and refresh the display; returns the snapshot."""
        snap = self.snapshot()
        try:
            if self.folder is not None:
                self.folder.write_atomic(PROGRESS_FILE, json.dumps(redact_doc(snap), indent=1, sort_keys=True),
                                         fsync=False)
            else:
                write_json_atomic(self.run_dir / PROGRESS_FILE, snap)
        except OSError as exc:  # a full disk must not end the run here; the ledger write will say so
            snap["note"] = f"progress.json not written: {exc}"
        if self.timeline is not None:
            self.timeline.interval(snap)
        if self._live is not None:
            self._live.refresh()
        elif not self._live_enabled:
            self._console.print(self.line(snap), highlight=False, markup=False)
        return snap

    def line(self, snap: dict[str, Any]) -> str:
        snap = redact_doc(snap)  # endpoint URLs and errors as shown: no user part, no query key
        final = snap["final_before_session"] + snap["done_this_session"]
        eta = snap["eta_s"]
        server = snap["server"]
        queue = ""
        if server.get("running") is not None:
            queue = f", server running {server['running']:.0f} waiting {server.get('waiting') or 0:.0f}"
        errors = " errors " + ",".join(f"{k}={v}" for k, v in sorted(snap["errors_by_class"].items())) \
            if snap["errors_by_class"] else ""
        more = "+ (ingesting)" if snap.get("ingesting") else ""
        sick = "".join(f", {_sick(e)}" for e in snap.get("sick") or []) + \
            "".join(f", {no_answer(e)}" for e in snap.get("no_answer") or [])
        return (f"[harvest] {final}/{snap['total']}{more} items, {snap['items_per_s']:.1f} items/s, "
                f"gen {snap['gen_tokens_per_s']:.0f} tok/s, prompt {snap['prompt_tokens_per_s']:.0f} tok/s, "
                f"{_load(snap)}{queue}{sick}{_cache(snap)}, ETA {_duration(eta)}{errors}")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The live panel, built from the current state at every refresh."""
        yield self._fresh_panel(min(options.max_width, PANEL_WIDTH))

    def _fresh_panel(self, width: int) -> Panel:
        with self._lock:
            snap = self.snapshot()
        if self._ingesting and self.data_path is not None:
            position = file_position(self.data_path)
            if position is not None:
                self.phases.on_event(Event("ingest", "update", {"position": position}))
        return self.panel(snap, width)

    def panel(self, snap: dict[str, Any], width: int = 0) -> Panel:
        snap = redact_doc(snap)  # endpoint URLs and errors as shown: no user part, no query key
        # Labels keep their width (never cut); a value longer than its line wraps at a word, so at
        # 80 columns every figure stays on screen (tests/cli/test_live_widths.py).
        body = Table.grid(padding=(0, 1))
        body.add_column(style="bold", no_wrap=True, min_width=LABEL_WIDTH)
        body.add_column(overflow="fold")
        phases = phase_table(self.phases)
        final = snap["final_before_session"] + snap["done_this_session"]
        total = snap["total"]
        more = "+" if snap.get("ingesting") else ""
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=max(total, 1), completed=min(final, max(total, 1)), width=40),
                    Text(f"{final:,} / {total:,}{more}  {final / total:.0%}" if total else f"{final:,} / -"))
        body.add_row("items", bar)
        body.add_row("", status_counts(self.before, snap["statuses_this_session"]))
        body.add_row("rate", f"{snap['items_per_s']:.1f} items/s   gen {snap['gen_tokens_per_s']:,.0f} tok/s   "
                             f"prompt {snap['prompt_tokens_per_s']:,.0f} tok/s")
        load = _load(snap)
        server = snap["server"]
        endpoints = snap.get("server_endpoints") or {}
        if len(endpoints) > 1:
            body.add_row("load", load)
            for url, q in sorted(endpoints.items()):
                body.add_row("", as_text(f"{url}  running {_count(q.get('running'))}   "
                                         f"waiting {_count(q.get('waiting'))}"))
        else:
            if server.get("running") is not None:
                load += f"   server running {server['running']:.0f}   waiting {server.get('waiting') or 0:.0f}"
            body.add_row("load", load)
        for e in snap.get("sick") or []:
            body.add_row("endpoint", Text(_sick(e), style="yellow"))
        for e in snap.get("no_answer") or []:
            body.add_row("endpoint", Text(no_answer(e), style="yellow"))
        cache = _cache(snap)
        if cache:
            body.add_row("cache", cache.strip(", "))
        if snap.get("stream"):
            body.add_row("tokens", stream_line(snap["stream"]))
        if snap["errors_by_class"]:
            body.add_row("errors", Text(", ".join(f"{k} {v}" for k, v in sorted(snap["errors_by_class"].items())),
                                        style="red"))
        if snap["state"] != "running":
            body.add_row("result", Text(str(snap["state"]), style="green" if snap["state"] == "finished" else "yellow"))
        else:
            eta = _duration(snap["eta_s"])
            body.add_row("ETA", eta + (f"  (rate over the last {self._window_s:.0f} s)" if snap["eta_s"] else ""))
        if snap.get("note"):
            body.add_row("note", as_text(snap["note"]))
        return Panel(Group(phases, Text(""), body), title=as_text(f"harvest run: {self.run_dir}"), title_align="left",
                     expand=bool(width), width=width or None)

    def __enter__(self) -> Progress:
        if self._live_enabled:
            self._live = Live(self, console=self._console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ingesting:  # the session ends before the ingest did: it resumes next time
            self._ingesting = False
            self.on_event(Event("ingest", "end", {"rows": self._rows_read}, ok=False))
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None


def _load(snap: dict[str, Any]) -> str:
    """``sent 32 (concurrency 32), 32 more claimed ahead in harvest's queue``: what is on the wire
    and what waits in harvest, apart; ``claimed 64`` before any request went out."""
    sent, queued = snap.get("sent"), snap.get("queued")
    if sent is None:
        return f"claimed {snap['in_flight']}" + _targets(snap)
    text = f"sent {sent}"
    if snap.get("concurrency"):
        text += f" (concurrency {snap['concurrency']})"
    text += _targets(snap)
    if queued:
        text += f", {queued} more claimed ahead in harvest's queue"
    return text


def _sick(e: dict[str, Any]) -> str:
    """``http://h:8000 not answering: 35 s waited of the 600 s health_deadline (last: ...)``."""
    if e.get("state") == "hung":  # last_error: "hung: no answer for 152 s while /health answered"
        return f"{e['url']} {e.get('last_error') or 'hung'}: no new requests to it for {e['waited_s']:.0f} s"
    deadline = e.get("deadline_s")
    of = f" of the {deadline:g} s health_deadline" if deadline else ""
    last = f" (last: {e['last_error']})" if e.get("last_error") else ""
    return f"{e['url']} {e.get('state', 'sick')}, not answering: {e['waited_s']:.0f} s waited{of}{last}"


def no_answer(e: Mapping[str, Any]) -> str:
    """``http://h:8000 no answer for 41 s (12 requests in flight; shown past 30 s of nothing back)``;
    found hung (``/health`` answering): ``...; hung, no new requests to it``."""
    hung = "; hung while /health answers: no new requests to it" if e.get("hung") else ""
    return (f"{e['url']} no answer for {e['quiet_s']:.0f} s ({e['outstanding']} requests in flight; shown past "
            f"{e['bound_s']:.0f} s of nothing back{hung})")


def _targets(snap: dict[str, Any]) -> str:
    """`` (auto target 48)``, or ``(auto targets 8+40)`` over several endpoints; "" when fixed."""
    targets = snap.get("concurrency_targets") or {}
    if not targets:
        return ""
    values = list(targets.values())
    if len(values) == 1:
        return f" (auto target {values[0]})"
    return f" (auto targets {'+'.join(str(v) for v in values)})"



#: Streamed items whose TTFT and TPOT the panel and progress.json summarize (the latest ones).
STREAM_RECENT = 2048


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    pick = [ordered[min(int(q * len(ordered)), len(ordered) - 1)] for q in (0.5, 0.9, 0.99)]
    return {"p50": round(pick[0], 6), "p90": round(pick[1], 6), "p99": round(pick[2], 6), "n": len(ordered)}


def stream_view(ttft: Sequence[float], tpot: Sequence[float]) -> dict[str, Any] | None:
    """``{"ttft_s": {p50, p90, p99, n}, "tpot_s": {...}}`` of the latest streamed items; None when
    nothing was streamed."""
    if not ttft and not tpot:
        return None
    return {"ttft_s": _quantiles(list(ttft)), "tpot_s": _quantiles(list(tpot))}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def stream_line(view: Mapping[str, Any]) -> str:
    """``TTFT p50 210 ms  p90 350 ms   TPOT p50 12 ms  p90 15 ms`` (the panel's "tokens" row)."""
    parts = []
    for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")):
        q = view.get(key)
        if q:
            parts.append(f"{name} p50 {_ms(q['p50'])}  p90 {_ms(q['p90'])}")
    return "   ".join(parts)


def _cache(snap: dict[str, Any]) -> str:
    """``, prefix cache hits 63%`` (the engines' counters over this session); "" when none reports it."""
    rate = (snap.get("prefix_cache") or {}).get("hit_rate")
    return "" if rate is None else f", prefix cache hits {rate:.0%}"


def phase_table(board: PhaseBoard) -> Table:
    """The phases, one row each: a mark (running / done / failed), name, elapsed, what it does."""
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(no_wrap=True, width=1)
    table.add_column(style="bold", no_wrap=True, width=10)
    table.add_column(justify="right", no_wrap=True, width=7)
    table.add_column(overflow="fold", ratio=1)  # what the phase does wraps, never cut
    for row in board.rows():
        mark = Text("▶", style="cyan") if row.active else (Text("✓", style="green") if row.ok
                                                            else Text("✗", style="bold red"))
        table.add_row(mark, row.name, _elapsed(row.elapsed_s), Text(row.text, style="" if row.active else "dim"))
    return table


_STATUS_STYLE = (("done", "green"), ("truncated", "yellow"), ("failed", "red"), ("skipped", "magenta"))


def status_counts(before: Mapping[str, int], session: Mapping[str, int]) -> Text:
    """``done 1,200  truncated 30  failed 4  skipped 0``, each in its colour (all sessions)."""
    text = Text()
    for status, style in _STATUS_STYLE:
        if text:
            text.append("   ")
        text.append(f"{status} ", style=style)
        text.append(f"{before.get(status, 0) + session.get(status, 0):,}", style=f"bold {style}")
    return text


def file_position(path: str) -> int | None:
    """How far this process has read into ``path``: the offset of an open descriptor on it, from
    /proc/self/fdinfo (Linux); None when none is open or it cannot be seen."""
    try:
        target = os.path.realpath(path)
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    best: int | None = None
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != target:
                continue
            with open(f"/proc/self/fdinfo/{fd}") as fh:
                for line in fh:
                    if line.startswith("pos:"):
                        pos = int(line.split()[1])
                        best = pos if best is None else max(best, pos)
        except (OSError, ValueError):
            continue
    return best


def _file_size(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        p = Path(path)
        return p.stat().st_size if p.is_file() else None
    except OSError:
        return None


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _elapsed(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else _duration(seconds)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


__all__ = ["PROGRESS_FILE", "Progress", "file_position", "no_answer", "phase_table", "status_counts",
           "write_json_atomic"]
