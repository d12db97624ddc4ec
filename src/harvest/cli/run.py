"""``harvest run JOB.toml``: the campaign, with its summary and exit code."""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import sys
import textwrap

import click

from harvest import aio
from harvest.campaign.run import RunReport, run_campaign
from harvest.campaign.run.runner import RUN_LOG
from harvest.checks import PreflightReport
from harvest.cli.options import job_flags, load_config_arg
from harvest.cli.render import make_console, print_refusal, show_preflight
from harvest.config import Override
from harvest.errors import LaunchError, LedgerError, PreflightFailed
from harvest.ledger import Status
from harvest.redact import redact_text
from harvest.words import counted

#: What ``--retry`` accepts: a status or an error class (letters, digits, underscores).
_RETRY_NAME = re.compile(r"[a-z][a-z0-9_]*")


def setup_logging() -> None:
    from harvest.cli.live import ShownFilter

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.addFilter(ShownFilter())
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


def _say(text: str, err: bool = False) -> None:
    """One line of the run's summary; on a terminal wrapped between words at its width (the
    terminal would cut a word in two), continued lines indented, a `command` kept whole to copy."""
    if (sys.stderr if err else sys.stdout).isatty():
        width = shutil.get_terminal_size().columns
        kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
        text = "\n".join(textwrap.wrap(kept, width, subsequent_indent="  ", break_long_words=False,
                                       break_on_hyphens=False)).replace("\0", " ") or text
    click.echo(text, err=err)


def print_report(report: RunReport, job: str | None = None) -> None:
    _say(f"run folder: {report.run_dir}")
    if report.recovered:
        _say(f"recovered {counted(report.recovered, 'item')} left running by an earlier crash")
    _say(f"this session: {counted(report.finished_this_session, 'item')} in {report.elapsed_s:.1f} s "
               f"({report.outcome}{'; ' + report.note if report.note else ''})")
    if report.relaunches:
        _say(f"server relaunched {report.relaunches} time(s)")
    for stop in report.stop_reports:
        _say(f"server stop: {'clean' if stop.clean else 'DIRTY'} in {stop.total_s:.2f} s")
    clean = report.totals.ok and report.skip_problem is None and report.failed_problem is None
    _say(("OK    " if clean else "CHECK ") + report.totals.describe())
    if report.skip_reasons:
        from harvest.dataset.skips import describe_skips

        for line in describe_skips(report.skip_reasons):
            _say(line, err=report.skip_problem is not None)
    if report.skip_problem is not None and not report.totals.unique:  # no row at all
        _say(f"FAILED: {report.skip_problem}; point [data] path at the rows (or fill the file) and run again",
             err=True)
    elif report.skip_problem is not None:
        every = report.totals.counts[Status.SKIPPED] >= report.totals.unique
        accept = "" if every else " (or raise [data] max_skipped_share to accept them)"
        _say(f"FAILED: {report.skip_problem}; fix [data] (or the rows) and run again: the skipped rows are "
                   f"read again{accept}", err=True)
    again = f"harvest run {job}" if job else "harvest run"
    if report.failed_problem is not None:
        _say(f"FAILED: {report.failed_problem}; `harvest status` shows why by class; `{redact_text(again)} "
             f"--retry failed` asks them again", err=True)
    if report.outcome == "interrupted":
        _say(f"interrupted: {counted(report.totals.counts[Status.PENDING], 'item')} pending; run `{again}` again "
             f"to resume where it stopped", err=True)
    if report.outcome == "server_down":
        pending = report.totals.counts[Status.PENDING] + report.totals.counts[Status.RUNNING]
        fix = ("read why the server harvest launched kept failing (server/server.log in the run folder)"
               if report.stop_reports else
               f"restart the server at {', '.join(report.hung)} (hung: it held requests while /health answered)"
               if report.hung else
               "start the server (or correct [server] base_url / [client] endpoints)")
        _say(f"what to do: {fix}, then run `{redact_text(again)}` again: the "
                   f"{counted(pending, 'item')} not finished will resume, no attempt charged", err=True)
    if report.trip is not None:
        _say(f"STOPPED: {report.trip.describe()}", err=True)
        left = report.totals.counts[Status.PENDING]
        _say(f"  the {counted(left, 'item')} not finished {'is' if left == 1 else 'are'} pending, no attempt "
                   f"charged; {report.trip.advice} (`harvest run` resumes them)", err=True)


def resume_args(job: str | None, overrides: tuple[Override, ...]) -> str:
    """What follows ``harvest run`` to run this job again: the file and the flags as given."""
    import json
    import shlex

    words = [job] if job else []
    for o in overrides:
        if o.flag.startswith("--set "):
            text = o.value if isinstance(o.value, str) else json.dumps(o.value)
            words += ["--set", f"{'.'.join(o.path)}={text}"]
        else:
            words += [o.flag, str(o.value)]
    return shlex.join(words)


def _check_retry(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if value in ("done", "pending", "running") or not _RETRY_NAME.fullmatch(value):
            raise click.BadParameter(
                f"{value!r}: retry 'failed', 'truncated', 'skipped' or an error class (e.g. http_400)",
                ctx=ctx, param=param)
    return values


@click.command("run")
@click.argument("job", type=click.Path(dir_okay=False), required=False)
@job_flags()
@click.option("--allow-mixed", is_flag=True, help="resume even though output-affecting settings changed.")
@click.option("--force", is_flag=True, help="launch the server even if preflight fails (failures still printed).")
@click.option("--live/--no-live", default=None, help="live display (default: when on a terminal).")
@click.option("--retry", "retry", multiple=True, metavar="WHAT", callback=_check_retry,
              help="first put items back to pending: 'failed', 'truncated', 'skipped' (rows read again "
                   "from the source under the current [data]) or an error class such as 'http_400' or "
                   "'empty' (repeatable; recorded in the ledger).")
@click.option("--all-hosts", is_flag=True, help="with [[hosts]]: refuse to run unless every host passes preflight.")
@click.option("--detach", is_flag=True, help="run in a session of its own, immune to the terminal's hangup, its "
              "output in the run folder's run.log; return once it passed its start checks (launch, model "
              "served), exit 0, printing how to watch it (harvest status RUN_DIR --watch) and stop it (harvest "
              "stop RUN_DIR); a run that ends before that: its own exit code.")
def run(job: str | None, overrides: tuple[Override, ...], allow_mixed: bool, force: bool, live: bool | None,
        retry: tuple[str, ...], all_hosts: bool, detach: bool) -> None:
    """Run or resume a campaign (JOB.toml, flags, or both): dataset -> ledger -> server -> results.
    The same command again resumes it."""
    from harvest.campaign.run import Launcher
    from harvest.cli.detach import child_fd, start_detached, started_on
    from harvest.cli.live import live_console, setup_console_logging
    from harvest.cli.panel import RunPanel
    from harvest.placement import from_config
    from harvest.report import REPORT_FILE

    if job is None and not overrides:
        raise click.UsageError("give a job file (JOB.toml) or the job as flags: --engine, --model, --data "
                               "(`harvest init` writes a job file to start from)")
    pipe = child_fd() if detach else None  # this process is the detached runner
    console = live_console()  # the panel, the log lines and the preflight rules share it
    setup_console_logging(console)
    config = load_config_arg(job, overrides)  # a mistake: exit 2 here, at the terminal, also with --detach
    args = sys.argv[1:] if sys.argv[1:2] == ["run"] else ["run", *shlex.split(resume_args(job, overrides)), "--detach"]
    if detach and pipe is None:
        sys.exit(start_detached(config, args))
    panel = RunPanel(console, live=False if detach else live)  # a panel on a terminal, lines off it
    if pipe is not None:
        panel.also = started_on(pipe)
    launcher = Launcher(detached=detach, log=RUN_LOG if detach else None, command=("harvest", *args))
    shown: list[PreflightReport] = []  # preflight reports already on screen

    def on_preflight(report: PreflightReport) -> None:
        shown.append(report)
        show_preflight(report, console)

    try:
        report = aio.run(run_campaign(config, placement=from_config(config), all_hosts=all_hosts,
                                      allow_mixed=allow_mixed, force=force, watch=panel,
                                      on_preflight=on_preflight, retry=retry,
                                      writes=(REPORT_FILE,), launcher=launcher))
    except PreflightFailed as exc:
        print_refusal(make_console(stderr=True), exc, rules_shown=bool(shown))  # its rules on screen once
        sys.exit(1)
    except LedgerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except LaunchError as exc:
        click.echo(f"error: the server did not start: {exc}", err=True)
        sys.exit(130 if exc.reason == "cancelled" else 1)
    print_report(report, resume_args(job, overrides))
    from harvest.cli.report import report_line

    click.echo(report_line(report.run_dir, held=report.folder))
    if report.folder is not None:
        report.folder.close()
    sys.exit(report.exit_code)
