"""Rendering shared by the CLI commands: rich tables and lines for people, JSON documents for scripts.

The JSON shapes built here are the documented ``--json`` schemas (docs/json-schema.md); change
them together with that document and its test. This module only formats records it is given: it
never measures, probes or exits.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harvest.gpu.payload import GPUS_SCHEMA, PREFLIGHT_SCHEMA, gpus_payload, now_iso, preflight_payload
from harvest.gpu.preflight import RuleResult, describe_process
from harvest.gpu.records import GpuSnapshot, HostState


def make_console(*, stderr: bool = False) -> Console:
    """A console that never wraps long lines (details stay one line) and adds no highlighting."""
    return Console(file=sys.stderr if stderr else sys.stdout, soft_wrap=True, highlight=False)


# -- harvest gpus ---------------------------------------------------------------------------------


def host_line(host: HostState) -> Text:
    return Text(f"host RAM: {host.ram_available_mib} MiB available of {host.ram_total_mib} MiB; "
                f"swap: {host.swap_used_mib} MiB used of {host.swap_total_mib} MiB")


def gpu_table(snap: GpuSnapshot) -> Table:
    """One row per GPU: index, name, used/total MiB, free, utilization, compute processes."""
    driver = f", driver {snap.driver_version}" if snap.driver_version else ""
    table = Table(title=f"GPUs ({snap.source}{driver})", title_justify="left")
    for col, justify in (("GPU", "right"), ("name", "left"), ("used / total MiB", "right"),
                         ("free MiB", "right"), ("util", "right"), ("processes", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for g in snap.gpus:
        procs = "\n".join(describe_process(p) for p in g.processes) or "-"
        util = f"{g.utilization_pct}%" if g.utilization_pct is not None else "n/a"
        table.add_row(str(g.index), Text(g.name), f"{g.used_mib} / {g.total_mib}", str(g.free_mib), util,
                      Text(procs))
    return table


def print_gpus(console: Console, snap: GpuSnapshot, host: HostState) -> None:
    if snap.unavailable_reason is not None:
        console.print(Text(f"GPUs: {snap.unavailable_reason}", style="bold yellow"))
    elif not snap.gpus:
        console.print(Text(f"GPUs: none found ({snap.source}, driver {snap.driver_version or 'unknown'})",
                           style="bold yellow"))
    else:
        console.print(gpu_table(snap))
    console.print(host_line(host))
    for w in snap.warnings:
        console.print(Text(f"note: {w}", style="dim"))


# -- harvest preflight ----------------------------------------------------------------------------


def verdict(result: RuleResult) -> str:
    return "SKIP" if result.skipped else ("PASS" if result.passed else "FAIL")


_STYLE = {"PASS": "green", "FAIL": "bold red", "SKIP": "dim"}


def rule_line(result: RuleResult) -> Text:
    """``PASS  gpu-memory     GPU 0 (...): free ... MiB >= ... MiB needed ...``"""
    word = verdict(result)
    line = Text()
    line.append(f"{word:<5}", style=_STYLE[word])
    line.append(f" {result.rule:<14} {result.detail}")
    return line


__all__ = [
    "GPUS_SCHEMA", "PREFLIGHT_SCHEMA", "gpu_table", "gpus_payload", "host_line", "make_console",
    "now_iso", "preflight_payload", "print_gpus", "rule_line", "verdict",
]
