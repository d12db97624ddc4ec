"""``harvest report DIR [-o FILE]``: a run, tune or compare folder as one self-contained HTML page.

Exit codes: 0 the report was written (its path printed), 2 the folder is none of the three kinds or
cannot be read. Parses options and prints only; the page is :func:`harvest.report.write_report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harvest.errors import ConfigError, LedgerError


def report_line(folder: str | Path) -> str:
    """Write the report of ``folder`` and return the line to print; a report that cannot be made
    says why instead (it never changes the exit code of the command that made the folder)."""
    from harvest.report import write_report

    try:
        return f"report: {write_report(folder)}"
    except Exception as exc:  # noqa: BLE001 - the work is done; a report failure is only reported
        return f"report not written ({type(exc).__name__}: {exc}); make it with harvest report {folder}"


@click.command("report")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write (default: FOLDER/report.html)")
def report(folder: Path, output: Path | None) -> None:
    """Write the HTML report of a run, tune or compare FOLDER (no network needed to view it)."""
    from harvest.report import write_report

    try:
        path = write_report(folder, output)
    except (ConfigError, LedgerError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(str(path))


__all__ = ["report", "report_line"]
