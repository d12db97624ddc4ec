"""``harvest preflight CONFIG``: is it safe to launch this server config here now, and if not, why.

Parses options, asks the placement (``harvest.gpu.preflight`` here, the far harvest on a host, a
task on each Ray node) and renders one line per rule; a finding that is the
same on several GPUs (and for both GPU rules) is one line naming them ("GPUs 0-7 requested but no
NVIDIA driver found"). ``--json`` stays one result per rule and GPU. Exit 0 when every
rule passes, 1 when one fails, 2 for a configuration or usage error (the CLI group maps ConfigError).
This command never launches, stops or signals anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from harvest.cli.options import host_options, job_flags, load_config_arg
from rich.console import Console

from harvest.cli.render import grouped, make_console, print_places_preflight, rule_line
from harvest.config import HostConfig, Override, ServerConfig
from harvest.gpu.paths import data_paths, paths_rule
from harvest.gpu.preflight import PreflightReport
from harvest.redact import redact_text
from harvest.placement import Flags, from_config


@click.command("preflight")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="re-check 5 times a second until every rule passes or SECONDS pass")
@click.option("--json", "as_json", is_flag=True,
              help="print the documented JSON document (harvest.preflight/2, the same on every placement)")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder whose disk must have room (default: [output] dir of the config)")
@host_options
@click.option("--cluster", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="check on every node of a Ray cluster (one table, a node column); ADDRESS: host:port, "
                   "ray://host:port or auto (the default); put it after CONFIG")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="with --cluster: seconds for the connection and for each node's answer (default: the "
                   "job's [cluster] connect_timeout, else 30)")
@job_flags()
@click.pass_context
def preflight(ctx: click.Context, config: Path | None, wait_s: float | None, as_json: bool,
              output_dir: Path | None, far_host: HostConfig | None, cluster: str | None,
              timeout: float | None, overrides: tuple[Override, ...]) -> None:
    """Check that the [server] of CONFIG can be launched safely where it would run, now: this
    machine, its [host] / [[hosts]], its [cluster] (each node), or the host of --host / --cluster."""
    if config is None and not overrides:
        raise click.UsageError("give a job file (CONFIG) or the server as flags: --engine, --model")
    cfg = load_config_arg(config, overrides)
    server = cfg.require_server()
    placement = from_config(cfg, Flags(host=far_host, cluster=cluster, timeout=timeout))
    console, err = make_console(), make_console(stderr=True)

    def waiting() -> None:
        if not as_json:
            err.print(f"waiting up to {wait_s:g} s for every rule to pass (checking every 0.2 s)", markup=False)

    checked = placement.preflight(cfg, output_dir=output_dir, wait_s=wait_s, on_wait=waiting)
    # Far places check what the engine needs there; the data is read here, by `harvest run`.
    near = paths_rule(data_paths(cfg.data)) if checked.here is None and cfg.data is not None else None
    if as_json:
        click.echo(json.dumps(checked.to_json(), indent=2))
    elif checked.here is not None:  # this machine's own report, every rule
        print_report(console, config if config is not None else cfg.source, server, checked.here, wait_s)
    else:
        print_places_preflight(console, checked)
    if near is not None and (not near.passed or not as_json):
        (err if as_json else console).print(f"this machine: {rule_line(near).plain}", markup=False)
    ctx.exit(0 if checked.passed and (near is None or near.passed) else 1)


def print_report(console: Console, config: Path | str, server: ServerConfig, report: PreflightReport,
                 wait_s: float | None) -> None:
    """This machine's preflight: a header, one line per rule (alike GPU findings joined), the
    waiting, the verdict."""
    gpus = ",".join(str(i) for i in server.gpus) or "none listed"
    where = f"{server.host}:{server.port}" if server.launched else redact_text(server.base_url or "")
    console.print(f"preflight of {config}: {server.engine} on {where}, GPUs {gpus}, tp {server.tp}", markup=False)
    for result in grouped(report.results):
        console.print(rule_line(result))
    for w in report.warnings:
        console.print(f"note: {w}", markup=False, style="dim")
    failures = report.failures
    if wait_s is not None:
        state = "passed" if report.passed else "still failing"
        console.print(f"waited {report.waited_s:.1f} s ({report.attempts} checks): {state}", markup=False)
        for result in grouped(failures):
            console.print(rule_line(result))
    if failures:
        console.print(f"FAIL: {len(failures)} of {len(report.results)} checks failed", markup=False,
                      style="bold red")
    else:
        console.print(f"PASS: all {len(report.results)} checks passed", markup=False, style="green")
