"""``harvest gpus``: what the GPUs and the host hold right now (NVML, nvidia-smi fallback, psutil).

Parses options and renders; the measuring lives in ``harvest.gpu``. A machine without an NVIDIA
driver is a state, shown as a line, not an error. This command never changes anything it shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import click

from harvest.cli.options import host_options
from harvest.cli.render import make_console, print_gpus_result
from harvest.config import HostConfig, load_config
from harvest.errors import ProbeError
from harvest.placement import Flags, from_config
from harvest.placement.base_results import GpusByPlace


@click.command("gpus")
@click.option("--json", "as_json", is_flag=True,
              help="print the documented JSON document (harvest.gpus/2, the same on every placement; with --watch, "
                   "one per line)")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="refresh every SECONDS until interrupted (or --count refreshes)")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="with --watch: stop after this many refreshes")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="show the [host] / [[hosts]] (a host column) or the [cluster] (a node column) "
                   "of this config instead")
@host_options
@click.option("--cluster", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="show every node of a Ray cluster (one table, a node column); ADDRESS: host:port, "
                   "ray://host:port or auto (the default)")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="with --cluster: seconds for the connection and for each node's answer (default: the "
                   "job's [cluster] connect_timeout, else 30)")
@click.pass_context
def gpus(ctx: click.Context, as_json: bool, watch: float | None, count: int | None, config_path: Path | None,
         far_host: HostConfig | None, cluster: str | None, timeout: float | None) -> None:
    """Show GPUs (memory, utilization, compute processes) and host RAM/swap, where the servers
    would run (this machine, the [host] / [[hosts]] or [cluster] of --config, --host, --cluster)."""
    cfg = load_config(config_path) if config_path is not None else None
    placement = from_config(cfg, Flags(host=far_host, cluster=cluster, timeout=timeout))
    console = make_console()
    if watch is None:
        result = _measured(placement.gpus)
        if as_json:
            click.echo(json.dumps(result.to_json(), indent=2))
        else:
            print_gpus_result(console, result)
        ctx.exit(0 if result.ok else 1)
    shown = 0
    with placement.gpus_live() as measure:  # refused where the GPUs are not this machine's
        while True:
            result = _measured(measure)
            if as_json:
                click.echo(json.dumps(result.to_json()))
            else:
                if console.is_terminal:
                    console.clear()
                print_gpus_result(console, result)
            shown += 1
            if count is not None and shown >= count:
                return
            time.sleep(watch)


def _measured(measure: Callable[[], GpusByPlace]) -> GpusByPlace:
    """One measurement; GPUs that cannot be measured here end the command (exit 1, one line)."""
    try:
        return measure()
    except ProbeError as exc:
        make_console(stderr=True).print(f"error: {exc}", markup=False)
        raise SystemExit(1) from None
