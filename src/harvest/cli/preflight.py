"""``harvest preflight CONFIG``: is it safe to launch this server config here now, and if not, why.

Parses options, runs ``harvest.gpu.preflight`` and renders one line per rule. Exit 0 when every
rule passes, 1 when one fails, 2 for a configuration or usage error (the CLI group maps ConfigError).
This command never launches, stops or signals anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from harvest.cli.render import make_console, preflight_payload, rule_line
from harvest.gpu import NoGpuProbe, open_probe, run_preflight, wait_for_preflight
from harvest.gpu.records import GpuProbe


@click.command("preflight")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="re-check 5 times a second until every rule passes or SECONDS pass")
@click.option("--json", "as_json", is_flag=True, help="print the documented JSON document (harvest.preflight/1)")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder whose disk must have room (default: [output] dir of the config)")
@click.pass_context
def preflight(ctx: click.Context, config: Path, wait_s: float | None, as_json: bool,
              output_dir: Path | None) -> None:
    """Check that the [server] of CONFIG can be launched safely on this machine (or its [host]) now."""
    from harvest.cli.remote import load_config_arg, remote_preflight

    cfg = load_config_arg(config)
    server = cfg.require_server()
    if cfg.far_hosts():
        ctx.exit(remote_preflight(cfg, as_json))
    out_dir = output_dir if output_dir is not None else Path(cfg.output.dir)
    # NVML is only opened when a rule will look at a GPU.
    probe: GpuProbe = open_probe() if (server.launched and server.gpus) else NoGpuProbe("no GPUs requested")
    console, err = make_console(), make_console(stderr=True)
    try:
        if wait_s is None:
            report = run_preflight(server, cfg.preflight, probe=probe, output_dir=out_dir)
        else:
            if not as_json:
                err.print(f"waiting up to {wait_s:g} s for every rule to pass (checking every 0.2 s)",
                          markup=False)
            report = wait_for_preflight(server, cfg.preflight, probe=probe, output_dir=out_dir, wait_s=wait_s)
    finally:
        probe.close()

    if as_json:
        click.echo(json.dumps(preflight_payload(report, config=str(config), engine=server.engine), indent=2))
    else:
        gpus = ",".join(str(i) for i in server.gpus) or "none"
        where = f"{server.host}:{server.port}" if server.launched else (server.base_url or "")
        console.print(f"preflight of {config}: {server.engine} on {where}, GPUs {gpus}, tp {server.tp}",
                      markup=False)
        for result in report.results:
            console.print(rule_line(result))
        for w in report.warnings:
            console.print(f"note: {w}", markup=False, style="dim")
        failures = report.failures
        if wait_s is not None:
            state = "passed" if report.passed else "still failing"
            console.print(f"waited {report.waited_s:.1f} s ({report.attempts} checks): {state}", markup=False)
            for result in failures:
                console.print(rule_line(result))
        if failures:
            console.print(f"FAIL: {len(failures)} of {len(report.results)} checks failed", markup=False,
                          style="bold red")
        else:
            console.print(f"PASS: all {len(report.results)} checks passed", markup=False, style="green")
    ctx.exit(0 if report.passed else 1)
