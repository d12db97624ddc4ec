"""``harvest run JOB.toml``: the campaign, with its summary and exit code."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import click

from harvest.campaign.run import RunReport, run_campaign
from harvest.config import load_config
from harvest.errors import LaunchError, LedgerError, PreflightFailed


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def show_preflight(report: Any) -> None:
    """Print every preflight rule of a launch, one line each."""
    from rich.console import Console

    from harvest.cli.render import rule_line

    console = Console(stderr=True, soft_wrap=True)
    console.print(f"preflight: {'PASS' if report.passed else 'FAIL'}", markup=False)
    for result in report.results:
        console.print(rule_line(result))


def print_report(report: RunReport) -> None:
    click.echo(f"run folder: {report.run_dir}")
    if report.recovered:
        click.echo(f"recovered {report.recovered} items left running by an earlier crash")
    click.echo(f"this session: {report.finished_this_session} items in {report.elapsed_s:.1f} s "
               f"({report.outcome}{'; ' + report.note if report.note else ''})")
    if report.relaunches:
        click.echo(f"server relaunched {report.relaunches} time(s)")
    for stop in report.stop_reports:
        click.echo(f"server stop: {'clean' if stop.clean else 'DIRTY'} in {stop.total_s:.2f} s")
    click.echo(("OK    " if report.totals.ok else "CHECK ") + report.totals.describe())


@click.command("run")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--allow-mixed", is_flag=True, help="Resume even though output-affecting settings changed.")
@click.option("--force", is_flag=True, help="Launch the server even if preflight fails (failures still printed).")
@click.option("--live/--no-live", default=None, help="Live display (default: when on a terminal).")
@click.option("--all-hosts", is_flag=True, help="With [[hosts]]: refuse to run unless every host passes preflight.")
def run(job: str, allow_mixed: bool, force: bool, live: bool | None, all_hosts: bool) -> None:
    """Run or resume the campaign of JOB.toml: dataset -> ledger -> server -> results."""
    from harvest.campaign.servers import server_factory_for

    setup_logging()
    config = load_config(job)
    try:
        report = asyncio.run(run_campaign(config, allow_mixed=allow_mixed, force=force, live=live,
                                          on_preflight=show_preflight,
                                          server_factory=server_factory_for(config, all_hosts=all_hosts)))
    except PreflightFailed as exc:
        for r in exc.results:
            if not getattr(r, "passed", True):
                click.echo(f"FAIL  {r.rule:<14} {r.detail}", err=True)
        click.echo("refusing to launch: preflight failed (--force to launch anyway)", err=True)
        sys.exit(1)
    except LedgerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except LaunchError as exc:
        click.echo(f"error: the server did not start: {exc}", err=True)
        sys.exit(130 if exc.reason == "cancelled" else 1)
    print_report(report)
    if report.outcome == "interrupted":
        sys.exit(130)
    sys.exit(0 if report.ok else 1)
