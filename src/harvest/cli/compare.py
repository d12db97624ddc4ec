"""``harvest compare --reference A.toml --candidate B.toml``: candidates' quality against a reference.

    harvest compare --reference A.toml --candidate B.toml [--candidate C.toml] [--probe N]
                    [--prompts FILE] [--settings TUNE.toml] [--no-floor] [--out DIR] [--json] [--force]

Prints a verdict table (the noise floor first, then each candidate) or, with ``--json``, the
``harvest.compare/1`` document also written to ``DIR/compare.json``. Exit codes: 0 every candidate
passed, 1 one did not, 2 usage or configuration error. Parses options and renders only; the work is
:func:`harvest.campaign.sweep.compare.compare`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from harvest.campaign.sweep.compare import CompareReport, compare
from harvest.campaign.sweep.tune_file import load_tune_file
from harvest.cli.run import setup_logging, show_preflight
from harvest.cli.sweep_render import (
    QUALITY_COLUMNS,
    VERDICT_STYLE,
    quality_cells,
    settings_text,
    wide_console,
)
from harvest.config import load_config
from harvest.placement import from_config
from harvest.quality.settings import QualitySettings
from harvest.cli.text import as_text

def compare_table(report: CompareReport) -> Table:
    floor = report.floor_source or "?"
    table = Table(title=as_text(f"compare: {report.prompts} probe prompts, floor from the {floor}"),
                  title_justify="left")
    for col in ("server", "settings", "KV tokens", *QUALITY_COLUMNS, "stop", "verdict"):
        table.add_column(col)
    for row in report.rows:
        kv = row.launch.kv_capacity_tokens if row.launch else None
        stop = row.launch.stop.verdict if row.launch and row.launch.stop else "-"
        table.add_row(as_text(row.label), Text(settings_text(row.settings)), str(kv) if kv is not None else "-",
                      *quality_cells(row.quality), stop,
                      Text(row.verdict, style=VERDICT_STYLE.get(row.verdict, "")))
    return table


def print_compare(report: CompareReport) -> None:
    console = wide_console()
    console.print(compare_table(report))
    for row in report.rows:
        for reason in row.reasons:
            console.print(Text(f"  {row.label}: {reason}"))
        if row.quality is not None and row.label == "floor":
            for note in row.quality.notes:
                console.print(Text(f"  note: {note}", style="dim"))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    console.print(Text(f"results: {report.out_dir / 'compare.json'}"))


@click.command("compare")
@click.option("--reference", "reference", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="job or server file of the trusted settings (its [data] supplies the probe prompts)")
@click.option("--candidate", "candidates", required=True, multiple=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="job or server file to compare (repeatable)")
@click.option("--probe", "probe_n", type=int, default=None, help="prompts drawn from the reference's [data]")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="extra probe prompts (any dataset shape); enough on its own without [data]")
@click.option("--settings", "settings_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="tune file whose [probe], [gate], [task] and [policy] apply")
@click.option("--no-floor", is_flag=True,
              help="no second launch of the reference (floor from its own launch)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the reference, outputs and compare.json "
                   "(default: <reference output.dir>/compare)")
@click.option("--json", "as_json", is_flag=True, help="print the harvest.compare/1 document")
@click.option("--force", is_flag=True, help="launch even when preflight fails")
def compare_cmd(reference: Path, candidates: tuple[Path, ...], probe_n: int | None, prompts_file: Path | None,
                settings_file: Path | None, no_floor: bool, out_dir: Path | None, as_json: bool,
                force: bool) -> None:
    """Compare the quality of CANDIDATE servers with the REFERENCE on the same probe prompts."""
    setup_logging()
    ref_job = load_config(reference)
    cand_jobs = [load_config(c) for c in candidates]
    settings = load_tune_file(settings_file).quality if settings_file else QualitySettings()
    probe = settings.probe
    updates: dict[str, Any] = {}
    if probe_n is not None:
        updates["prompts"] = probe_n
    if prompts_file is not None:
        updates["file"] = str(prompts_file)
        if ref_job.data is None and probe_n is None:
            updates["prompts"] = 0
    if no_floor:
        updates["floor_launch"] = False
    if updates:
        settings = settings.model_copy(update={"probe": probe.model_copy(update=updates)})
    out = out_dir or Path(ref_job.output.dir) / "compare"
    report = asyncio.run(compare(ref_job, cand_jobs, placement=from_config(ref_job), settings=settings,
                                 out_dir=out, force=force, on_preflight=show_preflight))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_compare(report)
    sys.exit(0 if report.passed else 1)

__all__ = ["compare_cmd", "compare_table", "print_compare"]
