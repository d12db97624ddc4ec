"""``harvest run``'s display: the run panel on a terminal, plain lines off it (a :class:`RunWatch`).

    panel = RunPanel(console, live=live)              # live None: when the console is a terminal
    await run_campaign(config, placement=..., watch=panel)

Fed by the session's phase events and its progress snapshots only
(``campaign/outputs/progress.py``: :class:`ProgressView`). On a terminal, a rich Live panel: the
phases with their elapsed time (``cli/phases.py``), a progress bar, the counts, the rates, the
load, the ETA; redrawn four times a second from a fresh view, so elapsed times grow while nothing
else moves. Off a terminal (a log, CI, ``--no-live``): one plain line per phase change and one per
progress.json write. Anything else printed meanwhile goes through the same console (it lands above
the panel). This module only renders.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from harvest.campaign.outputs.progress import ProgressView
from harvest.cli.live import PANEL_WIDTH, PhaseDisplay
from harvest.cli.phases import PhaseBoard, duration, phase_table
from harvest.cli.text import as_text
from harvest.events import Event
from harvest.redact import redact_doc, redact_text

#: The panel's label column: its longest label ("endpoint").
LABEL_WIDTH = 8


class RunPanel(PhaseDisplay):
    """The run's display on the command's console: the panel (or lines), from events and views.

    Hand it to ``run_campaign(watch=...)``; print through :attr:`console` meanwhile."""

    def __init__(self, console: Console, *, live: bool | None = None):
        super().__init__(console, "harvest run", live=live)
        self._look: Callable[[], ProgressView] | None = None
        #: Told every event too (``harvest run --detach``'s runner says "started" through it).
        self.also: Callable[[Event], None] | None = None

    def on_event(self, event: Event) -> None:
        super().on_event(event)
        if self.also is not None:
            self.also(event)

    def opened(self, look: Callable[[], ProgressView]) -> None:
        self._look = look
        self.__enter__()

    def updated(self, view: ProgressView) -> None:
        if self.live_enabled:
            self.refresh()
        else:
            self.console.print(progress_line(view.snap), highlight=False, markup=False, soft_wrap=True)

    def closed(self) -> None:
        self.close()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The live panel, built from a fresh view at every refresh."""
        if self._look is None:  # not opened yet: the phases alone
            yield from super().__rich_console__(console, options)
            return
        view = self._look()
        if view.snap.get("ingesting") and view.data_path is not None:
            position = file_position(view.data_path)
            if position is not None:
                self.board.on_event(Event("ingest", "update", {"position": position}))
        yield run_panel(view, self.board, min(options.max_width, PANEL_WIDTH))


def progress_line(snap: Mapping[str, Any]) -> str:
    """The periodic line off a terminal: ``[harvest] 12/300 items, 1.2 items/s, gen ... ETA 3m20s``."""
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
    eta_text = "ETA - (nothing comes back)" if snap.get("stalled") else f"ETA {duration(eta)}"
    return (f"[harvest] {final}/{snap['total']}{more} items, {snap['items_per_s']:.1f} items/s, "
            f"gen {snap['gen_tokens_per_s']:.0f} tok/s, prompt {snap['prompt_tokens_per_s']:.0f} tok/s, "
            f"{_load(snap)}{queue}{sick}{_cache(snap)}, {eta_text}{errors}")


def run_panel(view: ProgressView, board: PhaseBoard, width: int = 0) -> Panel:
    """The run panel: the phases of ``board`` above the figures of ``view`` (``width`` 0: as wide
    as it needs)."""
    snap = redact_doc(view.snap)  # endpoint URLs and errors as shown: no user part, no query key
    # Labels keep their width (never cut); a value longer than its line wraps at a word, so at
    # 80 columns every figure stays on screen (tests/cli/test_live_widths.py).
    body = Table.grid(padding=(0, 1))
    body.add_column(style="bold", no_wrap=True, min_width=LABEL_WIDTH)
    body.add_column(overflow="fold")
    phases = phase_table(board)
    final = snap["final_before_session"] + snap["done_this_session"]
    total = snap["total"]
    more = "+" if snap.get("ingesting") else ""
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(total, 1), completed=min(final, max(total, 1)), width=40),
                Text(f"{final:,} / {total:,}{more}  {final / total:.0%}" if total else f"{final:,} / -"))
    body.add_row("items", bar)
    body.add_row("", status_counts(view.before, snap["statuses_this_session"]))
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
    for row in level_rows(view.snap):
        body.add_row("level", as_text(row))
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
    elif snap.get("stalled"):  # nothing comes back (the endpoint rows say why): the last minute's rate says nothing
        body.add_row("ETA", Text("-  (nothing comes back: none until answers do)", style="yellow"))
    else:
        eta = duration(snap["eta_s"])
        body.add_row("ETA", eta + (f"  (rate over the last {view.window_s:.0f} s)" if snap["eta_s"] else ""))
    if snap.get("note"):
        body.add_row("note", as_text(snap["note"]))
    return Panel(Group(phases, Text(""), body), title=as_text(f"harvest run: {view.run_dir}"), title_align="left",
                 expand=bool(width), width=width or None)


def _load(snap: Mapping[str, Any]) -> str:
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


def _sick(e: Mapping[str, Any]) -> str:
    """``http://h:8000 not answering: 35 s waited of the 600 s health_deadline (last: ...)``; a server
    harvest launched: ``... of the 120 s hang_deadline, then relaunched``; during its relaunch:
    ``http://h:8000 being relaunched (...)``; one harvest does not own, found hung: ``...; restart
    the server``."""
    last = e.get("last_error")
    if e.get("state") == "relaunching":
        return f"{e['url']} being relaunched" + (f" ({last})" if last else "")
    if e.get("state") == "hung":  # last_error: "hung: no answer for 152 s while /health answered"
        advice = "" if e.get("managed", True) else "; restart the server"
        return f"{e['url']} {last or 'hung'}: no new requests to it for {e['waited_s']:.0f} s{advice}"
    deadline = e.get("deadline_s")
    name = e.get("deadline_name") or "health_deadline"
    then = ", then relaunched" if e.get("managed") else ""
    of = f" of the {deadline:g} s {name}{then}" if deadline else ""
    return f"{e['url']} {e.get('state', 'sick')}, not answering: {e['waited_s']:.0f} s waited{of}" + \
        (f" (last: {last})" if last else "")


def no_answer(e: Mapping[str, Any]) -> str:
    """``http://h:8000 no answer for 41 s (12 requests in flight; shown past 30 s of nothing back)``;
    found hung (``/health`` answering): ``...; hung, no new requests to it``, and for an endpoint
    harvest does not own (nothing relaunches it) ``; restart the server``."""
    hung = "; hung while /health answers: no new requests to it" if e.get("hung") else ""
    if e.get("hung") and e.get("managed") is False:
        hung += "; restart the server"
    return (f"{e['url']} no answer for {e['quiet_s']:.0f} s ({e['outstanding']} requests in flight; shown past "
            f"{e['bound_s']:.0f} s of nothing back{hung})")


def _targets(snap: Mapping[str, Any]) -> str:
    """`` (auto target 48)``, or ``(auto targets 8+40)`` over several endpoints; "" when fixed."""
    targets = snap.get("concurrency_targets") or {}
    if not targets:
        return ""
    values = list(targets.values())
    if len(values) == 1:
        return f" (auto target {values[0]})"
    return f" (auto targets {'+'.join(str(v) for v in values)})"


def short_time(seconds: float) -> str:
    """A short time with the digits it needs: ``1.25 s``, ``210 ms``, ``2.5 ms``, ``850 µs``."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1e3:.0f} ms"
    if seconds >= 0.001:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def level_rows(snap: Mapping[str, Any]) -> list[str]:
    """Under ``concurrency = "auto"``, each endpoint's level and why it is there (``1024: engine
    capacity 1024 from /props``; the URL first when there are several, as shown: no user part, no
    query key); [] when fixed. ``snap`` as recorded: a reason is found by its endpoint's URL before
    that is redacted (a key named in a URL's query would hide the reason with it)."""
    targets = snap.get("concurrency_targets") or {}
    reasons = snap.get("concurrency_reasons") or {}
    rows = []
    for url, target in targets.items():
        why = f": {redact_text(str(reasons[url]))}" if reasons.get(url) else ""
        rows.append(f"{redact_text(url)}  {target}{why}" if len(targets) > 1 else f"{target}{why}")
    return rows


def stream_line(view: Mapping[str, Any]) -> str:
    """``TTFT p50 210 ms  p90 350 ms   TPOT p50 12 ms  p90 15 ms   ITL p50 11 ms  p90 14 ms`` (the
    panel's "tokens" row, and ``harvest status``'s)."""
    parts = []
    for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s")):
        q = view.get(key)
        if q:
            parts.append(f"{name} p50 {short_time(q['p50'])}  p90 {short_time(q['p90'])}")
    return "   ".join(parts)


def _cache(snap: Mapping[str, Any]) -> str:
    """``, prefix cache hits 63%`` (the engines' counters over this session); "" when none reports it."""
    rate = (snap.get("prefix_cache") or {}).get("hit_rate")
    return "" if rate is None else f", prefix cache hits {rate:.0%}"


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


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


__all__ = ["LABEL_WIDTH", "RunPanel", "file_position", "no_answer", "progress_line", "run_panel",
           "short_time", "status_counts", "stream_line"]
