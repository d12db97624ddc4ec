"""``harvest report DIR [-o FILE]``: a run, tune or compare folder as one self-contained HTML page.

Exit codes: 0 the report was written (its path printed), 2 the folder is none of the three kinds or
cannot be read. Parses options and prints only; the page is :func:`harvest.report.write_report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harvest import safefiles
from harvest.errors import ConfigError, LedgerError
from harvest.redact import escape_controls


def report_line(folder: str | Path, held: safefiles.Folder | None = None) -> str:
    """Write the report of ``folder`` and return the line to print; a report that cannot be made
    says why instead (it never changes the exit code of the command that made the folder).
    ``held``: the folder as the command still holds it (read and written through it only)."""
    from harvest.report import write_report

    try:
        return f"report: {write_report(folder, held=held)}"
    except Exception as exc:  # noqa: BLE001 - the work is done; a report failure is only reported
        return f"report not written ({type(exc).__name__}: {exc}); make it with harvest report {folder}"


@click.command("report")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write (default: FOLDER/report.html)")
def report(folder: Path, output: Path | None) -> None:
    """Write the HTML report of a run, tune or compare FOLDER (no network needed to view it)."""
    from harvest.report import write_report

    if not folder.exists():
        click.echo(escape_controls(f"error: {folder} does not exist: give the folder `harvest run`, `tune` or "
                                   f"`compare` wrote (a job's [output] dir)"), err=True)
        sys.exit(2)
    try:
        path = write_report(folder, output)
    except ConfigError as exc:
        why = "; ".join(f"{where} is {msg}" if msg.startswith("not ") else f"{where}: {msg}"
                        for where, msg in exc.problems)
        click.echo(escape_controls(f"error: {why}: give the folder `harvest run`, `tune` or `compare` wrote "
                                   f"(a job's [output] dir)"), err=True)
        sys.exit(2)
    except LedgerError as exc:
        click.echo(escape_controls(f"error: {folder} is not a readable run folder: {exc}"), err=True)
        sys.exit(2)
    click.echo(str(path))


__all__ = ["report", "report_line"]
