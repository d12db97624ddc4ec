"""Progress of a running campaign: rates, ETA, the server's queue, errors by class.

One :class:`Progress` per run. The runner feeds it counts; it renders a rich live panel on a
terminal, plain periodic log lines elsewhere, and writes ``progress.json`` (atomically) for
``harvest status`` in another shell. It never reads the ledger and never blocks the event loop on
anything slower than a small file write.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

PROGRESS_FILE = "progress.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (mode 0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


class Progress:
    """Counts and rates of one run, with a live display and progress.json."""

    def __init__(self, run_dir: Path, *, total: int, already_final: int, stream: TextIO | None = None,
                 live: bool | None = None, window_s: float = 60.0):
        self.run_dir = run_dir
        self.total = total
        self.already_final = already_final
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
        self.state = "running"
        self.note: str | None = None
        #: True while the dataset is still being ingested (``total`` grows with it).
        self.ingesting = False
        self._window: deque[tuple[float, int, int, int]] = deque()
        self._window_s = window_s
        stream = stream or sys.stderr
        self._console = Console(file=stream, stderr=stream is sys.stderr, soft_wrap=True)
        self._live_enabled = self._console.is_terminal if live is None else live
        self._live: Live | None = None
        #: The run's timeline recorder (harvest.campaign.timeline), fed beside the counts; optional.
        self.timeline: Any = None

    # --- feeding ---------------------------------------------------------------------------------

    def record(self, status: str, prompt_tokens: int = 0, completion_tokens: int = 0,
               latency_s: float | None = None) -> None:
        self.done += 1
        self.statuses[status] += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if self.timeline is not None:
            self.timeline.item(status, latency_s, prompt_tokens, completion_tokens)

    def error(self, error_class: str) -> None:
        self.errors[error_class] += 1

    # --- rates -----------------------------------------------------------------------------------

    def rates(self) -> dict[str, float]:
        """Items/s and tokens/s over the last ``window_s`` seconds."""
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
            "statuses_this_session": dict(self.statuses), "errors_by_class": dict(self.errors),
            "server": dict(self.server), "concurrency_targets": dict(self.concurrency),
            **{k: round(v, 3) for k, v in rates.items()},
        }

    # --- output ----------------------------------------------------------------------------------

    def update(self) -> dict[str, Any]:
        """Write progress.json and refresh the display; returns the snapshot."""
        snap = self.snapshot()
        try:
            write_json_atomic(self.run_dir / PROGRESS_FILE, snap)
        except OSError as exc:  # a full disk must not end the run here; the ledger write will say so
            snap["note"] = f"progress.json not written: {exc}"
        if self.timeline is not None:
            self.timeline.interval(snap)
        if self._live is not None:
            self._live.update(self._table(snap))
        elif not self._live_enabled:
            self._console.print(self.line(snap), highlight=False)
        return snap

    def line(self, snap: dict[str, Any]) -> str:
        final = snap["final_before_session"] + snap["done_this_session"]
        eta = snap["eta_s"]
        server = snap["server"]
        queue = ""
        if server.get("running") is not None:
            queue = f" server running {server['running']:.0f} waiting {server.get('waiting') or 0:.0f}"
        errors = " errors " + ",".join(f"{k}={v}" for k, v in sorted(snap["errors_by_class"].items())) \
            if snap["errors_by_class"] else ""
        more = "+ (ingesting)" if snap.get("ingesting") else ""
        return (f"[harvest] {final}/{snap['total']}{more} items, {snap['items_per_s']:.1f} items/s, "
                f"gen {snap['gen_tokens_per_s']:.0f} tok/s, prompt {snap['prompt_tokens_per_s']:.0f} tok/s, "
                f"in flight {snap['in_flight']}{_targets(snap)}{queue}, ETA {_duration(eta)}{errors}")

    def _table(self, snap: dict[str, Any]) -> Table:
        table = Table(title=f"harvest run: {self.run_dir}", show_header=False, expand=False)
        final = snap["final_before_session"] + snap["done_this_session"]
        more = "+ (ingesting)" if snap.get("ingesting") else ""
        table.add_row("items", f"{final} / {snap['total']}{more}  ({snap['done_this_session']} this session)")
        table.add_row("rate", f"{snap['items_per_s']:.1f} items/s   gen {snap['gen_tokens_per_s']:.0f} tok/s   "
                              f"prompt {snap['prompt_tokens_per_s']:.0f} tok/s")
        table.add_row("in flight", str(snap["in_flight"]) + _targets(snap))
        server = snap["server"]
        if server.get("running") is not None:
            table.add_row("server", f"running {server['running']:.0f}   waiting {server.get('waiting') or 0:.0f}")
        table.add_row("ETA", _duration(snap["eta_s"]))
        if snap["errors_by_class"]:
            table.add_row("errors", ", ".join(f"{k} {v}" for k, v in sorted(snap["errors_by_class"].items())))
        if snap.get("note"):
            table.add_row("note", str(snap["note"]))
        return table

    def __enter__(self) -> Progress:
        if self._live_enabled:
            self._live = Live(self._table(self.snapshot()), console=self._console, refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None


def _targets(snap: dict[str, Any]) -> str:
    """`` (auto target 48)``, or ``(auto targets 8+40)`` over several endpoints; "" when fixed."""
    targets = snap.get("concurrency_targets") or {}
    if not targets:
        return ""
    values = list(targets.values())
    if len(values) == 1:
        return f" (auto target {values[0]})"
    return f" (auto targets {'+'.join(str(v) for v in values)})"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


__all__ = ["PROGRESS_FILE", "Progress", "write_json_atomic"]
