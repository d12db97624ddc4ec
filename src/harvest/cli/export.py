"""``harvest export RUN_DIR --format specforge|sharegpt|openai-batch|parquet``: results out of the ledger.

Parses options and reports; the writing lives in ``harvest.campaign.outputs.export``. Exit codes: 0 the file
was written with every selected item, 1 some results were malformed and left out (they are named),
or no item was selected (unless ``--allow-empty``),
2 the folder holds no readable ledger or the options do not fit. Never changes the ledger.
"""

from __future__ import annotations

import click

from harvest import api
from harvest.campaign.outputs.export import (
    FORMATS,
    ExportReport,
    ROW_GROUP_SIZE,
    SHAREGPT_STYLES,
    nothing_selected,
    selected_statuses,
)
from harvest.cli.render import make_console
from harvest.errors import LedgerError, NothingToExport
from harvest.redact import escape_controls


@click.command("export")
@click.argument("run_dir", metavar="RUN_DIR|JOB.toml", type=click.Path(path_type=str))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="what to write")
@click.option("--status", "statuses", multiple=True, default=(),
              help="item statuses to export, comma-separated or repeated (done, truncated, failed, skipped,"
                   " pending, running; which ones a format can hold is checked)  [default: done; openai-batch: "
                   "done,truncated,failed,skipped]")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="file to write (default: RUN_DIR/export.<format>.jsonl or RUN_DIR/export.parquet)")
@click.option("--sharegpt-style", type=click.Choice(SHAREGPT_STYLES), default="role-content",
              show_default=True, help="sharegpt turns as role/content, or from/value with human/gpt/system")
@click.option("--row-group-size", type=click.IntRange(min=1), default=ROW_GROUP_SIZE, show_default=True,
              help="parquet: rows per row group")
@click.option("--allow-empty", is_flag=True, help="exit 0 even when no item was exported")
def export(run_dir: str, fmt: str, statuses: tuple[str, ...], output: str | None, sharegpt_style: str,
           row_group_size: int, allow_empty: bool) -> None:
    """Export a run's results (streamed from its ledger, written atomically). RUN_DIR is the run
    folder, or the job file whose [output] dir it is. Writing no item at all exits 1 (with the
    run's counts) unless --allow-empty."""
    from harvest.cli.status import run_dir_of

    run_dir = run_dir_of(run_dir, "export")
    err = make_console(stderr=True)
    try:
        report = api.export(run_dir, fmt, output=output, statuses=statuses, sharegpt_style=sharegpt_style,
                            row_group_size=row_group_size, allow_empty=allow_empty)
    except LedgerError as exc:
        err.print(escape_controls(f"error: {run_dir} is not a readable harvest run folder: {exc}"), markup=False)
        raise SystemExit(2) from None
    except NothingToExport as exc:  # nothing selected: no file written, the cause and the fix (in flags)
        said = (nothing_selected(run_dir, fmt, selected_statuses(fmt, statuses), exc.report)
                if isinstance(exc.report, ExportReport) else str(exc))
        err.print(escape_controls(f"error: {said}"), markup=False)
        raise SystemExit(1) from None
    parts = ", ".join(f"{status} {n:,}" for status, n in report.by_status.items())
    rows = f" in {report.rows:,} rows (one per sample and turn)" if fmt == "logprobs" else ""
    click.echo(escape_controls(f"wrote {report.written:,} items{rows} to {report.path}"
                               + (f" ({parts})" if parts else "")))
    if report.malformed:
        err.print(f"error: {report.malformed:,} results are not in the documented result schema and were"
                  " left out:", markup=False)
        for item_id, why in report.malformed_examples:
            # the ledger's text, perhaps another user's: shown with control characters escaped
            err.print(escape_controls(f"  {item_id}: {why}", one_line=True), markup=False)
        raise SystemExit(1)


__all__ = ["export"]
