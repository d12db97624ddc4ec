"""``harvest status RUN_DIR|JOB.toml [--json]``: where a run stands (counts, totals, throughput, ETA, errors).

Parses options and renders a :class:`~harvest.campaign.outputs.status.RunStatus`; the reading and measuring
live in ``harvest.campaign.outputs.status``. The ``--json`` document (``harvest.status/1``) is documented in
docs/result-schema.md; change both together. Exit codes: 0 the run folder was read (whatever state
the run is in), 2 the folder holds no readable harvest ledger. This command never writes to the run
folder and never signals the runner.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harvest import api, schemas
from harvest.campaign.outputs.status import RunStatus
from harvest.cli.panel import no_answer, stream_line
from harvest.cli.render import make_console
from harvest.errors import LedgerError
from harvest.ledger import Status
from harvest.redact import escape_controls, redact_doc, redact_text
from harvest.words import counted

STATUS_SCHEMA = schemas.STATUS


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def status_payload(st: RunStatus) -> dict[str, Any]:
    """The ``harvest status --json`` document."""
    t = st.totals
    p = st.progress
    return {
        "schema": STATUS_SCHEMA,
        "time": _iso(st.measured_at),
        "run_dir": str(st.run_dir),
        "counts": {s.value: st.counts[s] for s in Status},
        "totals": {
            "input_rows": t.input_rows, "unique": t.unique, "duplicates": t.duplicates,
            "id_conflicts": t.id_conflicts,
            "skipped": st.skipped, "results": t.results, "settled": st.settled, "remaining": st.remaining,
            "ingest_complete": t.ingest_complete, "ok": t.ok, "problems": list(t.problems),
            "summary": t.describe(),
        },
        "throughput": {
            "source": st.throughput.source, "items_per_s": st.throughput.items_per_s,
            "gen_tokens_per_s": st.throughput.gen_tokens_per_s,
            "prompt_tokens_per_s": st.throughput.prompt_tokens_per_s,
            "window_s": st.throughput.window_s, "results_in_window": st.throughput.results_in_window,
        },
        "eta_s": st.eta_s,
        "runner": {"pid": st.runner.pid, "alive": st.runner.alive, "source": st.runner.source,
                   "recorded_state": st.runner.recorded_state, "detail": st.runner.detail},
        "progress": None if p is None else {
            "started_at": p.started_at, "updated_at": p.updated_at, "state": p.state,
            "done_this_session": p.done_this_session, "in_flight": p.in_flight,
            "errors_by_class": dict(p.errors_by_class),
            "server": {"running": p.server_running, "waiting": p.server_waiting}, "note": p.note,
            "concurrency_targets": dict(p.concurrency_targets), "sent": p.sent,
            "concurrency_reasons": dict(p.concurrency_reasons),
            "prefix_cache_hit_rate": p.prefix_cache_hit_rate, "no_answer": [dict(e) for e in p.no_answer],
        },
        "skipped_reasons": [r.to_dict() for r in st.skip_reasons],
        "model": st.model,
        "failed_by_class": dict(st.failed_by_class),
        "last_errors": [{"id": e.item_id, "error_class": e.error_class, "message": e.message,
                         "attempts": e.attempts, "source": e.source, "source_line": e.source_line}
                        for e in st.last_errors],
        "samples_per_item": st.samples,
        "logprobs": {"k": st.logprobs_k, "bytes": st.logprob_bytes, "shards": st.logprob_shards},
        "token_timing": None if st.token_timing is None else {k: dict(v) for k, v in st.token_timing.items()},
        "settings_hashes": list(st.settings_hashes),
        "created_at": st.created_at,
        "harvest_version": st.harvest_version,
        "notes": list(st.notes),
    }


def duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h >= 48:
        return f"{h // 24}d{h % 24:02d}h"
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _rate(value: float | None, unit: str) -> str:
    """A rate, or "-" when unknown (a rate that is not a finite number >= 0 is unknown)."""
    return "-" if value is None or not 0 <= value < math.inf else f"{value:,.1f} {unit}"


def _t(text: str, style: str | None = None) -> Text:
    """One line for the terminal: secrets by shape hidden, control characters (ESC, BEL, CR,
    newlines...) shown escaped."""
    return Text(escape_controls(redact_text(text), one_line=True), style=style or "")


def _samples_line(st: RunStatus) -> str | None:
    """``samples per item: 4; logprobs top-5: 1.2 MiB in 1 shard``, when there is more than one."""
    if st.samples <= 1 and not st.logprobs_k:
        return None
    lp = (f"; logprobs top-{st.logprobs_k}: {st.logprob_bytes / 2**20:,.1f} MiB in {st.logprob_shards} shard"
          f"{'s' if st.logprob_shards != 1 else ''}" if st.logprobs_k else "")
    return f"samples per item: {st.samples}{lp}"


def print_status(console: Console, st: RunStatus) -> None:
    """The people's view: counts table, totals line, rate, ETA, runner, recent errors. Every string
    read from the run folder (ids, error classes and messages, the runner's recorded state, notes,
    skip reasons) may be another user's: each line shows control characters escaped."""
    unique = st.totals.unique * st.samples  # item rows: one per sample
    table = Table(title=_t(f"harvest run {st.run_dir}"), title_justify="left")
    table.add_column("status")
    table.add_column("items", justify="right")
    table.add_column("share", justify="right")
    for s in Status:
        n = st.counts[s]
        share = f"{100 * n / unique:.1f}%" if unique else "-"
        table.add_row(s.value, f"{n:,}", share)
    label = "unique input" if st.samples == 1 else f"unique input x {st.samples} samples"
    table.add_row(_t(label, style="bold"), _t(f"{unique:,}", style="bold"), "")
    console.print(table)
    if (samples := _samples_line(st)) is not None:
        console.print(_t(samples))

    t = st.totals
    if t.ok:
        console.print(_t(f"totals OK: {t.describe()}", style="green"))
    else:
        style = "yellow" if st.remaining or not t.ingest_complete else "bold red"
        console.print(_t(f"totals: {t.describe()}", style=style))
    conflicts = f" ({t.id_conflicts:,} id conflicts: same id, different content)" if t.id_conflicts else ""
    console.print(_t(f"input: {counted(t.input_rows, 'row')}, {counted(t.duplicates, 'duplicate')}{conflicts}, "
                     f"{st.skipped:,} skipped"))
    if st.skip_reasons:
        from harvest.dataset.skips import describe_skips

        for line in describe_skips(st.skip_reasons):
            console.print(_t(line, style="magenta" if line.startswith("skipped") else "dim"))

    tp = st.throughput
    if tp.source == "progress":
        origin = "live, from progress.json"
    elif tp.source == "ledger":
        origin = f"from the ledger: {tp.results_in_window:,} results in the last {duration(tp.window_s)}"
    else:
        origin = "no result in the last " + duration(tp.window_s)
    console.print(_t(f"rate: {_rate(tp.items_per_s, 'items/s')}, gen {_rate(tp.gen_tokens_per_s, 'tok/s')},"
                       f" prompt {_rate(tp.prompt_tokens_per_s, 'tok/s')} ({origin})"))
    eta = "done" if st.eta_s == 0.0 else duration(st.eta_s)
    console.print(_t(f"ETA: {eta} ({st.remaining:,} pending or running)"))
    if st.token_timing:  # streamed answers, over the run
        console.print(_t(f"tokens (streamed): {stream_line(st.token_timing)}"))

    alive = {True: "alive", False: "not running", None: "unknown"}[st.runner.alive]
    style = {True: "green", False: "yellow", None: "dim"}[st.runner.alive]
    console.print(_t(f"runner: {alive} ({st.runner.detail})", style=style))
    p = st.progress
    if p is not None and st.runner.alive:
        extra = (f"sent {p.sent}, claimed {p.in_flight if p.in_flight is not None else '-'}" if p.sent is not None
                 else f"claimed {p.in_flight if p.in_flight is not None else '-'}")
        if p.server_running is not None:
            extra += f", server running {p.server_running:.0f} waiting {p.server_waiting or 0:.0f}"
        if p.prefix_cache_hit_rate is not None:
            extra += f", prefix cache hits {p.prefix_cache_hit_rate:.0%}"
        if p.errors_by_class:
            extra += ", errors this session " + ", ".join(
                f"{k} {v}" for k, v in sorted(p.errors_by_class.items()))
        console.print(_t(extra))
        for quiet in p.no_answer:  # a hung endpoint: requests held open, nothing back
            console.print(_t("endpoint " + no_answer(quiet), style="yellow"))
    if len(st.settings_hashes) > 1:
        console.print(_t(f"settings: mixed ({', '.join(st.settings_hashes)})", style="yellow"))

    if st.failed_by_class:
        console.print(_t("failed by class: " + ", ".join(f"{k} {v:,}" for k, v in
                                                             sorted(st.failed_by_class.items()))))
        errors = Table(title="last errors", title_justify="left")
        for col in ("id", "class", "attempts", "message"):
            errors.add_column(col)
        for e in st.last_errors:
            message = e.message if len(e.message) <= 160 else e.message[:157] + "..."
            errors.add_row(_t(e.item_id), _t(e.error_class), str(e.attempts), _t(message))
        console.print(errors)
    for note in st.notes:
        console.print(_t(f"note: {note}", style="dim"))


def run_dir_of(target: str, command: str = "status") -> str:
    """The run folder ``target`` names: the folder itself, or a job file's ``[output] dir``. One
    that does not exist: exit 2 saying what to give instead."""
    from pathlib import Path

    if not Path(target).exists():
        make_console(stderr=True).print(escape_controls(
            f"error: {target} does not exist: give a run folder (a job's [output] dir) or the job file, "
            f"e.g. `harvest {command} runs/first-job`"), markup=False)
        raise SystemExit(2)
    if Path(target).is_file():
        from harvest.config import load_config

        return load_config(target).output.dir
    return target


@click.command("status")
@click.argument("run_dir", metavar="RUN_DIR|JOB.toml", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="print the documented JSON document (harvest.status/1)")
@click.option("--errors", "errors_limit", type=click.IntRange(min=0), default=10, show_default=True,
              help="how many of the most recent failures to list")
@click.option("--watch", "watch_live", is_flag=True, help="the live panel of the run going on, from any terminal, "
              "until its session ends (exit 0 when it finished, else 1); Ctrl-C stops watching, not the run")
def status(run_dir: str, as_json: bool, errors_limit: int, watch_live: bool) -> None:
    """Show where a run stands: counts by status, totals, throughput, ETA, skip reasons, last errors.
    RUN_DIR is the run folder, or the job file whose [output] dir it is."""
    run_dir = run_dir_of(run_dir)
    if watch_live:
        if as_json:
            raise click.UsageError("--watch draws the live panel; --json prints one document: give one")
        from pathlib import Path

        from harvest.cli.live import live_console
        from harvest.cli.watch import watch

        raise SystemExit(watch(Path(run_dir), live_console()))
    try:
        st = api.status(run_dir, errors_limit=errors_limit)
    except LedgerError as exc:
        make_console(stderr=True).print(escape_controls(f"error: {run_dir} is not a readable harvest run folder: "
                                                        f"{exc}"), markup=False)
        raise SystemExit(2) from None
    if as_json:
        # what the run folder holds, redacted again: a run written by an older harvest may hold a
        # URL's user part or a query key in its meta or progress.json
        click.echo(json.dumps(redact_doc(status_payload(st)), indent=2))
    else:
        print_status(make_console(), st)


__all__ = ["STATUS_SCHEMA", "duration", "print_status", "status", "status_payload"]
