"""Rendering shared by the CLI commands: rich tables and lines for people, JSON documents for scripts.

The JSON shapes built here are the documented ``--json`` schemas (docs/json-schema.md); change
them together with that document and its test. This module only formats records it is given: it
never measures, probes or exits.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harvest.gpu.preflight import PreflightReport, RuleResult, describe_process
from harvest.gpu.records import GpuSnapshot, HostState

GPUS_SCHEMA = "harvest.gpus/1"
PREFLIGHT_SCHEMA = "harvest.preflight/1"


def make_console(*, stderr: bool = False) -> Console:
    """A console that never wraps long lines (details stay one line) and adds no highlighting."""
    return Console(file=sys.stderr if stderr else sys.stdout, soft_wrap=True, highlight=False)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# -- harvest gpus ---------------------------------------------------------------------------------


def gpus_payload(snap: GpuSnapshot, host: HostState, *, time: str | None = None) -> dict[str, Any]:
    """The ``harvest gpus --json`` document."""
    return {
        "schema": GPUS_SCHEMA,
        "time": time or now_iso(),
        "source": snap.source,
        "driver_version": snap.driver_version,
        "unavailable_reason": snap.unavailable_reason,
        "warnings": list(snap.warnings),
        "gpus": [
            {
                "index": g.index, "uuid": g.uuid, "name": g.name,
                "total_mib": g.total_mib, "used_mib": g.used_mib, "free_mib": g.free_mib,
                "reserved_mib": g.reserved_mib, "utilization_pct": g.utilization_pct,
                "processes": [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib, "visible": p.visible}
                              for p in g.processes],
            }
            for g in snap.gpus
        ],
        "host": {
            "ram_total_mib": host.ram_total_mib, "ram_available_mib": host.ram_available_mib,
            "swap_total_mib": host.swap_total_mib, "swap_used_mib": host.swap_used_mib,
        },
    }


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


def preflight_payload(report: PreflightReport, *, config: str, engine: str) -> dict[str, Any]:
    """The ``harvest preflight --json`` document."""
    return {
        "schema": PREFLIGHT_SCHEMA,
        "time": now_iso(),
        "config": config,
        "engine": engine,
        "passed": report.passed,
        "attempts": report.attempts,
        "waited_s": report.waited_s,
        "warnings": list(report.warnings),
        "results": [
            {"rule": r.rule, "passed": r.passed, "skipped": r.skipped, "gpu": r.gpu, "detail": r.detail,
             "numbers": dict(r.numbers)}
            for r in report.results
        ],
    }


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
