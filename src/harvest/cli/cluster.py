"""The near side of ``harvest gpus --cluster`` and ``harvest preflight CONFIG --cluster``: one table
with a node column, rendered from the JSON documents every Ray node returned (see
:mod:`harvest.placement.ray.probe`, which does the Ray work). A node that did not answer is a row naming
it and the time waited, and makes the command exit 1. Nothing here signals a process.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from harvest.cli.render import make_console, verdict
from harvest.config import HarvestConfig

#: Seconds each step (connect, every node's answer) may take unless ``--timeout`` says otherwise.
DEFAULT_TIMEOUT = 30.0
_STYLE = {"PASS": "green", "FAIL": "bold red", "SKIP": "dim"}


def _missing(answers: list[Any]) -> list[Any]:
    return [a for a in answers if a.doc is None]


def cluster_gpus(address: str, as_json: bool, timeout: float, runtime_env: dict[str, Any] | None = None) -> int:
    """``harvest gpus --cluster ADDRESS``; the exit code (1 when a node gave no answer). ``runtime_env``:
    the job's Ray runtime environment (a ``[cluster] runtime_env``), e.g. to put harvest on the
    workers' ``PYTHONPATH``."""
    from harvest.cli.remote import gpus_by_table
    from harvest.placement.ray.probe import cluster_gpus as probe

    answers = probe(address, timeout=timeout, runtime_env=runtime_env)
    if as_json:
        click.echo(json.dumps({"schema": "harvest.gpus-cluster/1", "address": address,
                               "nodes": [a.to_dict() for a in answers]}, indent=2))
        return 1 if _missing(answers) else 0
    console = make_console()
    docs = [(a.label, a.doc) for a in answers]
    console.print(gpus_by_table(docs, column="node", title=f"GPUs by Ray node ({address}, {len(answers)} alive)",
                                missing={a.label: f"{a.error} (waited {a.waited_s:.1f} s)" for a in answers}))
    for a in answers:
        if a.doc is not None and "host" in a.doc:
            h = a.doc["host"]
            console.print(Text(f"{a.label}: host RAM {h['ram_available_mib']} MiB available of "
                               f"{h['ram_total_mib']} MiB; swap {h['swap_used_mib']} MiB used of "
                               f"{h['swap_total_mib']} MiB"))
    for a in _missing(answers):
        console.print(Text(f"node {a.label}: {a.error} (waited {a.waited_s:.1f} s)", style="bold red"))
    return 1 if _missing(answers) else 0


def cluster_preflight(cfg: HarvestConfig, address: str, as_json: bool, timeout: float,
                      output_dir: str | None, runtime_env: dict[str, Any] | None = None) -> int:
    """``harvest preflight CONFIG --cluster ADDRESS``: the [server] of CONFIG checked on every node;
    exit 0 when every node answered and passed, else 1."""
    from harvest.placement.far_records import preflight_report_from_dict
    from harvest.placement.ray.probe import cluster_preflight as probe

    server = cfg.require_server()
    answers = probe(address, server.model_dump(mode="json"), cfg.preflight.model_dump(mode="json"),
                    config=cfg.source, timeout=timeout, output_dir=output_dir, runtime_env=runtime_env)
    passed = {a.label: bool(a.doc and a.doc.get("passed")) for a in answers}
    ok = all(passed.values()) and not _missing(answers)
    if as_json:
        click.echo(json.dumps({"schema": "harvest.preflight-cluster/1", "address": address, "config": cfg.source,
                               "passed": ok, "nodes": [a.to_dict() for a in answers]}, indent=2))
        return 0 if ok else 1
    console = make_console()
    console.print(f"preflight of {cfg.source} on the Ray cluster {address} ({len(answers)} alive nodes): "
                  f"{server.engine}, GPUs {','.join(str(i) for i in server.gpus) or 'none'}, tp {server.tp}",
                  markup=False)
    table = Table(title="preflight by Ray node", title_justify="left")
    for col in ("node", "check", "rule", "detail"):
        table.add_column(col)
    for a in answers:
        if a.doc is None:
            table.add_row(Text(a.label), Text("NONE", style="bold red"), "-",
                          Text(f"{a.error} (waited {a.waited_s:.1f} s)"))
            continue
        report = preflight_report_from_dict(a.doc, host=a.label)
        for r in report.results:
            word = verdict(r)
            table.add_row(Text(a.label), Text(word, style=_STYLE[word]), r.rule,
                          Text(r.detail.removeprefix(f"[{a.label}] ")))
    console.print(table)
    for a in answers:
        word = "no answer" if a.doc is None else ("PASS" if passed[a.label] else "FAIL")
        console.print(f"{word} on node {a.label}", markup=False, style="green" if word == "PASS" else "bold red")
    return 0 if ok else 1


__all__ = ["DEFAULT_TIMEOUT", "cluster_gpus", "cluster_preflight"]
