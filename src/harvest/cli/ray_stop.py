"""``harvest stop RUN_DIR`` of a Ray run: every server of the run stopped on its node, one report each.

The record is the driver's ``server/ray.json``; the stops run on the nodes (each actor's supervisor),
so every verdict is measured there. A server whose node is gone gets a DIRTY report that says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from harvest.placement.ray.servers import stop_ray_run


def ray_stop(run_dir: Path, deadline: float | None, as_json: bool) -> None:
    from harvest.cli.serve import STOP_SCHEMA, print_stop_report

    reports = stop_ray_run(run_dir, deadline=deadline)
    clean = all(r.clean for r in reports)
    if as_json:
        click.echo(json.dumps({"schema": STOP_SCHEMA, "servers": [r.to_dict() for r in reports],
                               "verdict": "clean" if clean else "dirty"}, indent=2))
    else:
        if not reports:
            click.echo(f"{run_dir}: no server of this Ray run was running")
        for r in reports:
            print_stop_report(r)
        if reports:
            click.echo(f"{len(reports)} server(s) of the Ray run: {'all CLEAN' if clean else 'NOT all clean'}")
    sys.exit(0 if clean else 1)
