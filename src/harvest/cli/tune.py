"""``harvest tune JOB.toml --grid TUNE.toml``: sweep server settings under the quality gate.

    harvest tune JOB.toml --grid TUNE.toml [--out DIR] [--then-run] [--json] [--force]

One line per trial while the sweep runs (stderr), then the table: settings, KV tokens, peak running
requests, generation tok/s, quality metrics with their intervals, stop verdict and verdict; CSV and
JSON are written to the tune folder. ``--then-run`` starts the campaign of JOB.toml with the best
passing setting. Exit codes: 0 a setting passed (and, with --then-run, the campaign finished with
its totals adding up), 1 none passed or the campaign did not finish, 2 usage or configuration error,
130 interrupted. Parses options and renders only; the sweep is :func:`harvest.campaign.sweep.tune.tune`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harvest.campaign.run import run_campaign
from harvest.campaign.sweep.tune import TrialResult, TuneReport, job_with_server, tune
from harvest.campaign.sweep.tune_file import load_tune_file
from harvest.cli.run import print_report, show_preflight
from harvest.cli.options import job_flags
from harvest.cli.sweep_render import (
    QUALITY_COLUMNS,
    VERDICT_STYLE,
    quality_cells,
    settings_text,
    wide_console,
)
from harvest.config import Override, load_config
from harvest.placement import from_config
from harvest.cli.text import as_text


def _num(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def tune_table(report: TuneReport) -> Table:
    best = report.best
    title = (f"tune: {len(report.trials)} trials, {report.prompts} probe prompts, floor from the "
             f"{report.floor_source or '?'}" + (" (reference reused)" if report.reused_reference else ""))
    table = Table(title=as_text(title), title_justify="left")
    for col in ("#", "settings", "KV tokens", "peak run", "gen tok/s", "tok/s (metrics)", *QUALITY_COLUMNS,
                "stop", "verdict"):
        table.add_column(col)
    for t in report.trials:
        tp = t.throughput
        kv = tp.kv_capacity_tokens if tp else (t.launch.kv_capacity_tokens if t.launch else None)
        mark = "*" if best is not None and t.index == best.index else ""
        stop = t.launch.stop.verdict if t.launch and t.launch.stop else "-"
        label = f"{t.index}{mark}" + (" (ref)" if t.is_reference else "")
        table.add_row(label, Text(settings_text(t.overrides)), _num(kv),
                      _num(tp.peak_running if tp else None),
                      _num(tp.gen_tok_s if tp else None), _num(tp.gen_tok_s_metrics if tp else None),
                      *quality_cells(t.quality), stop,
                      Text(t.verdict, style=VERDICT_STYLE.get(t.verdict, "")))
    return table


def print_tune(report: TuneReport) -> None:
    console = wide_console()
    console.print(tune_table(report))
    for t in report.trials:
        for reason in t.reasons:
            console.print(Text(f"  trial {t.index}: {reason}"))
    if report.floor is not None:
        for note in report.floor.notes:
            console.print(Text(f"note: {note}", style="dim"))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    best = report.best
    console.print(Text(f"best: trial {best.index} {settings_text(best.overrides)}" if best else
                       "best: none passed the quality gate"))
    console.print(Text(f"results: {report.out_dir / 'tune.csv'}, {report.out_dir / 'tune.json'}"))


def _progress(trial: TrialResult, console: Console) -> None:
    tp = trial.throughput
    speed = f", {tp.gen_tok_s:.1f} gen tok/s" if tp else ""
    why = f" ({trial.reasons[0]})" if trial.reasons and trial.verdict != "pass" else ""
    console.print(f"trial {trial.index}: {settings_text(trial.overrides)}: {trial.verdict}{speed}{why}",
                  markup=False)


@click.command("tune")
@click.argument("job", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--grid", "grid", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="tune file: [grid], [reference], [probe], [gate], [policy], [throughput], [sweep]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="tune folder (default: <job output.dir>/tune)")
@click.option("--then-run", is_flag=True, help="run the campaign with the best passing setting")
@click.option("--json", "as_json", is_flag=True, help="print the harvest.tune/1 document")
@click.option("--force", is_flag=True, help="launch even when preflight fails")
@job_flags(common=False)
def tune_cmd(job: Path, grid: Path, out_dir: Path | None, then_run: bool, as_json: bool, force: bool,
             overrides: tuple[Override, ...]) -> None:
    """Sweep the server settings of TUNE.toml for JOB.toml; keep the fastest that passes the gate."""
    from harvest.cli.live import PhaseDisplay, live_console, setup_console_logging

    console = live_console()  # the panel of the trial's phases; logs and rules print above it
    setup_console_logging(console)
    job_cfg = load_config(job, overrides)
    tune_file = load_tune_file(grid)
    placement = from_config(job_cfg)  # where every trial runs, and the campaign after them
    with PhaseDisplay(console, f"harvest tune: {grid}") as display:
        report = asyncio.run(tune(job_cfg, tune_file, placement=placement, out_dir=out_dir, force=force,
                                  on_preflight=lambda r: show_preflight(r, console),
                                  on_trial=lambda t: _progress(t, console), on_event=display.on_event))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_tune(report)
    from harvest.cli.report import report_line

    click.echo(report_line(report.out_dir), err=as_json)
    best = report.best
    if best is None or best.config is None:
        sys.exit(1)
    if not then_run:
        sys.exit(0)
    click.echo(f"running the campaign with trial {best.index}: {settings_text(best.overrides)}", err=True)
    from harvest.cli.panel import RunPanel

    run_report = asyncio.run(run_campaign(job_with_server(job_cfg, best.config), placement=placement,
                                          watch=RunPanel(console),
                                          on_preflight=lambda r: show_preflight(r, console)))
    if as_json:
        click.echo(f"campaign: {run_report.outcome}; {run_report.totals.describe()}", err=True)
    else:
        print_report(run_report)
    click.echo(report_line(run_report.run_dir), err=as_json)
    if run_report.outcome == "interrupted":
        sys.exit(130)
    sys.exit(0 if run_report.ok else 1)

__all__ = ["print_tune", "tune_cmd", "tune_table"]
