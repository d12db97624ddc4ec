"""``harvest version [--json]``: this harvest's version and the JSON schemas it reads and writes.

A near harvest asks a far one for this document before anything else and refuses to go on when
either differs (see :mod:`harvest.placement.ssh.remote`).
"""

from __future__ import annotations

import json

import click

from harvest.schemas import version_payload


@click.command("version")
@click.option("--json", "as_json", is_flag=True, help="print the JSON document (harvest.version/1)")
def version(as_json: bool) -> None:
    """Print harvest's version (and, with --json, its JSON schemas)."""
    doc = version_payload()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"harvest {doc['version']}")
