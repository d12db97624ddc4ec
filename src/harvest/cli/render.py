"""Rendering shared by the CLI commands: rich tables and lines for people, JSON documents for scripts.

The JSON shapes built here are the documented ``--json`` schemas (docs/json-schema.md); change
them together with that document and its test. This module only formats records it is given: it
never measures, probes or exits.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harvest import schemas
from harvest.checks import PreflightReport
from harvest.errors import PreflightFailed
from harvest.gpu.payload import GPUS_SCHEMA, PREFLIGHT_SCHEMA, gpus_payload, now_iso, preflight_payload
from harvest.gpu.preflight import RuleResult, describe_process
from harvest.gpu.records import GpuSnapshot, HostState
from harvest.cli.text import as_text
from harvest.redact import escape_controls
from harvest.placement.base_results import GpusByPlace, PreflightByPlace
from harvest.stops import StopReport, StopStep


def shown(text: object) -> str:
    """Text for the terminal that may hold another user's: a process name or command line, a
    record's field, a far host's answer. Control characters (ESC, BEL...) are shown escaped;
    newlines and tabs stay (a table cell of several lines)."""
    return escape_controls(str(text))


def make_console(*, stderr: bool = False) -> Console:
    """A console that never wraps long lines (details stay one line) and adds no highlighting."""
    return Console(file=sys.stderr if stderr else sys.stdout, soft_wrap=True, highlight=False)


# -- harvest gpus ---------------------------------------------------------------------------------


def host_line(host: HostState) -> Text:
    return host_ram_line(None, {"ram_available_mib": host.ram_available_mib, "ram_total_mib": host.ram_total_mib,
                                "swap_used_mib": host.swap_used_mib, "swap_total_mib": host.swap_total_mib})


def gpu_table(snap: GpuSnapshot) -> Table:
    """One row per GPU: index, name, used/total MiB, free, utilization, compute processes."""
    driver = f", driver {snap.driver_version}" if snap.driver_version else ""
    table = Table(title=as_text(f"GPUs ({snap.source}{driver})"), title_justify="left")
    for col, justify in (("GPU", "right"), ("name", "left"), ("used / total MiB", "right"),
                         ("free MiB", "right"), ("util", "right"), ("processes", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for g in snap.gpus:
        procs = "\n".join(describe_process(p) for p in g.processes) or "-"
        util = f"{g.utilization_pct}%" if g.utilization_pct is not None else "n/a"
        table.add_row(str(g.index), Text(shown(g.name)), f"{g.used_mib} / {g.total_mib}", str(g.free_mib), util,
                      Text(shown(procs)))
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
    line.append(shown(f" {result.rule:<14} {result.detail}"))
    return line


def gpu_ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``"0-3,6"``."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def grouped(results: Sequence[RuleResult]) -> list[RuleResult]:
    """The results to print: those of GPU rules that say the same thing (same verdict, same text but
    for the GPU's index) become one result naming every GPU and rule, in order of first appearance."""
    groups: dict[tuple[str, str], list[RuleResult]] = {}
    order: list[tuple[str, str] | RuleResult] = []
    for r in results:
        if r.gpu is None or not re.search(rf"\bGPU {r.gpu}\b", r.detail):
            order.append(r)
            continue
        key = (verdict(r), re.sub(rf"\bGPU {r.gpu}\b", "GPU {}", r.detail, count=1))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    out: list[RuleResult] = []
    for entry in order:
        if isinstance(entry, RuleResult):
            out.append(entry)
            continue
        members = groups[entry]
        if len(members) == 1:
            out.append(members[0])
            continue
        gpus = sorted({m.gpu for m in members if m.gpu is not None})
        rules = list(dict.fromkeys(m.rule for m in members))
        where = f"GPUs {gpu_ranges(gpus)}" if len(gpus) > 1 else f"GPU {gpus[0]}"
        out.append(replace(members[0], rule=", ".join(rules), gpu=None,
                           detail=entry[1].replace("GPU {}", where, 1)))
    return out


def show_preflight(report: PreflightReport, console: Console | None = None) -> None:
    """Print every preflight rule of a launch, one line each, GPU rules that say the same grouped
    (through ``console`` when given: the one a live display draws on, so the rules land above its
    panel; else stderr)."""
    console = console or Console(stderr=True, soft_wrap=True)
    console.print(f"preflight: {'PASS' if report.passed else 'FAIL'}", markup=False)
    for result in grouped(report.results):
        console.print(rule_line(result))


def preflight_refusal(failures: Sequence[RuleResult], where: str = "") -> str:
    """The line that ends a launch refused by preflight, with what to do. ``--force`` is offered only
    when every failed rule is a margin a user may choose to overrun (GPU memory, GPU processes, host
    RAM, swap, disk): launching does not get a port that something else holds."""
    port = next((r for r in failures if r.rule == "port"), None)
    if port is not None:
        number = port.numbers.get("port", "")
        return (f"refused to launch{where}: port {number} is taken; stop what holds it, or set another "
                f"[server] port")
    return f"refused to launch{where}: preflight failed (--force launches anyway)"


def print_refusal(console: Console, exc: PreflightFailed, where: str = "", *, rules_shown: bool = False) -> None:
    """A launch refused by preflight (``harvest run``, ``harvest serve``): each failed rule, unless
    the launch's report was on screen already (``rules_shown``), then the line saying what to do."""
    if not rules_shown:
        for r in exc.failures:
            console.print(rule_line(r))
    console.print(preflight_refusal(exc.failures, where), markup=False)


# -- far answers: SSH hosts and Ray nodes (one table, a column naming the place) -------------------


def host_ram_line(label: str | None, host: dict[str, Any]) -> Text:
    """``LABEL: host RAM ... MiB available of ... MiB; swap ... MiB used of ... MiB`` (one wording)."""
    lead = f"{label}: host RAM" if label else "host RAM:"
    swap = "swap" if label else "swap:"
    return Text(f"{lead} {host['ram_available_mib']} MiB available of {host['ram_total_mib']} MiB; "
                f"{swap} {host['swap_used_mib']} MiB used of {host['swap_total_mib']} MiB")


def gpus_by_table(docs: list[tuple[str, dict[str, Any] | None]], *, column: str, title: str,
                  missing: dict[str, str] | None = None) -> Table:
    """One table of ``harvest gpus --json`` documents, a first column naming where each came from
    (a host, a Ray node); ``missing`` maps a label without a document to why."""
    table = Table(title=as_text(title), title_justify="left")
    for col, justify in ((column, "left"), ("GPU", "right"), ("name", "left"), ("used / total MiB", "right"),
                         ("free MiB", "right"), ("util", "right"), ("processes", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for label, doc in docs:
        if doc is None:
            table.add_row(Text(label), "-", Text(f"no answer: {(missing or {}).get(label, '?')}"), "", "", "", "")
            continue
        if not doc.get("gpus"):
            why = doc.get("error") or doc.get("unavailable_reason") or f"none found ({doc.get('source')})"
            table.add_row(Text(label), "-", Text(f"no GPUs: {why}"), "", "", "", "")
        for g in doc.get("gpus") or []:
            procs = "\n".join(f"pid {p['pid']} {p.get('name') or '?'} {p.get('used_mib')} MiB"
                              for p in g["processes"]) or "-"
            util = f"{g['utilization_pct']}%" if g.get("utilization_pct") is not None else "n/a"
            table.add_row(Text(shown(label)), str(g["index"]), Text(shown(g["name"])),
                          f"{g['used_mib']} / {g['total_mib']}", str(g["free_mib"]), util, Text(shown(procs)))
    return table


def print_places_gpus(console: Console, result: GpusByPlace) -> None:
    """A placement's GpusByPlace: the table, each place's host RAM, and the places that gave no answer."""
    console.print(gpus_by_table([(a.label, a.doc) for a in result.answers], column=result.column,
                                title=result.title, missing={a.label: a.error or "?" for a in result.answers}))
    for a in result.answers:
        if a.doc is not None and "host" in a.doc:
            console.print(host_ram_line(a.label, a.doc["host"]))
    for a in result.answers:
        if a.doc is None:
            console.print(Text(f"{a.label}: {a.error}", style="bold red"))


def print_gpus_result(console: Console, result: GpusByPlace) -> None:
    """What ``harvest gpus`` shows: this machine's own measurement in full, else the places' table."""
    if result.here is not None:
        print_gpus(console, *result.here)
    else:
        print_places_gpus(console, result)


def print_places_preflight(console: Console, result: PreflightByPlace) -> None:
    """A placement's PreflightByPlace: one table (place, check, rule, detail), then a verdict per place."""
    console.print(result.header, markup=False)
    table = Table(title=f"preflight by {result.column}", title_justify="left")
    for col in (result.column, "check", "rule", "detail"):
        table.add_column(col)
    for a in result.answers:
        if a.doc is None:
            table.add_row(Text(a.label), Text("NONE", style="bold red"), "-", Text(a.error or "?"))
            continue
        for r in a.doc.get("results", []):
            word = "SKIP" if r.get("skipped") else ("PASS" if r.get("passed") else "FAIL")
            table.add_row(Text(shown(a.label)), Text(word, style=_STYLE[word]), as_text(r.get("rule")),
                          Text(shown(str(r.get("detail", "")).removeprefix(f"[{a.label}] "))))
    console.print(table)
    for a in result.answers:
        word = "no answer" if a.doc is None else ("PASS" if a.doc.get("passed") else "FAIL")
        console.print(f"{word} on {a.label}", markup=False, style="green" if word == "PASS" else "bold red")


# -- stop reports and the ps table (every placement) ----------------------------------------------


def stop_payload(reports: list[StopReport]) -> dict[str, Any]:
    """The ``harvest stop --json`` document (``harvest.stop/1``), the same for every placement:
    ``verdict`` (clean when every server's stop is; nothing left to stop is clean), ``servers``
    (one StopReport each)."""
    clean = all(r.clean for r in reports)
    return {"schema": schemas.STOP, "verdict": "clean" if clean else "dirty",
            "servers": [r.to_dict() for r in reports]}


def stopped_name(report: StopReport) -> str:
    """What a stop report is about: ``vllm pid 4242 in runs/a/server`` (engine and pid when known)."""
    who = " ".join(p for p in (report.engine, f"pid {report.pid}" if report.pid is not None else "") if p)
    return f"{who} in {report.run_dir}" if who else report.run_dir


def step_line(step: StopStep) -> str:
    mark = "" if step.ok else "  <-- incomplete"
    return shown(f"  {step.name:<8} {step.duration_s:7.3f} s  {step.outcome}{mark}")


def print_stop_report(report: StopReport, *, err: bool = False, console: Console | None = None,
                      steps_shown: bool = False) -> None:
    """The stop's steps, holders, problems and verdict (``steps_shown``: the steps were already
    printed as they happened, only the rest is left)."""
    console = console or make_console(stderr=err)
    if not steps_shown:
        console.print(shown(f"stop of {stopped_name(report)}:"), markup=False)
        for step in report.steps:
            console.print(step_line(step), markup=False)
    for h in report.holders:
        who = "ours" if h.ours else "not ours"
        mib = f"{h.used_mib} MiB" if h.used_mib is not None else "MiB unknown"
        console.print(shown(f"  holder: GPU {h.gpu} pid {h.pid} {h.name or '?'} {mib} ({who})"), markup=False)
    for p in report.problems:
        console.print(shown(f"  problem: {p}"), markup=False)
    esc = ", escalated to SIGKILL" if report.escalated else ""
    which = f" for {stopped_name(report)}" if steps_shown else ""  # else the header line named it
    console.print(shown(f"verdict: {report.verdict.upper()} in {report.total_s:.2f} s "
                        f"(deadline {report.deadline_s:g} s{esc}){which}"), markup=False)


def print_stop_reports(reports: list[StopReport], where: str, *, console: Console | None = None,
                       steps_shown: bool = False) -> None:
    """Every server's stop report, and a closing line when there were several (or none);
    ``steps_shown``: their steps were printed as they happened."""
    console = console or make_console()
    if not reports:
        console.print(f"{where}: no server of this run was running", markup=False)
    for r in reports:
        print_stop_report(r, console=console, steps_shown=steps_shown)
    if len(reports) > 1:
        clean = all(r.clean for r in reports)
        console.print(f"{len(reports)} servers on {where}: {'all CLEAN' if clean else 'NOT all clean'}",
                      markup=False)


def ps_payload(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``harvest ps --json`` document (``harvest.ps/1``): one row per server, with ``where``."""
    return {"schema": schemas.PS, "servers": rows}


def print_ps(console: Console, rows: list[dict[str, Any]], where: str, show_all: bool) -> None:
    """The ps table, the same for every placement (a WHERE column: this machine, a host, a node)."""
    if not rows:
        console.print(f"no server harvest started is running on {where}"
                      + ("" if show_all else " (--all lists stopped ones)"), markup=False)
        return
    console.print(f"{'WHERE':<24} {'ENGINE':<10} {'PID':>7} {'PORT':>5}  {'RECORDED':<9} {'ALIVE':<7} "
                  f"{'LISTENING':<9} {'STARTED':<19}  RUN DIR", markup=False)
    for r in rows:
        started = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started_at"]))
                   if r.get("started_at") else "?")
        alive = f"{r['measured']['alive']}/{r['recorded']['processes']}"
        # the record's fields (or a far host's answer) may hold another user's text: escaped
        console.print(escape_controls(
            f"{str(r.get('where')):<24} {str(r.get('engine')):<10} {str(r.get('pid')):>7} "
            f"{str(r.get('port')):>5}  {r['recorded']['status']:<9} {alive:<7} "
            f"{'yes' if r['measured']['port_listening'] else 'no':<9} {started:<19}  {r.get('run_dir')}",
            one_line=True), markup=False)


__all__ = [
    "GPUS_SCHEMA", "PREFLIGHT_SCHEMA", "gpu_ranges", "gpu_table", "grouped", "gpus_by_table", "gpus_payload", "host_line", "host_ram_line",
    "make_console", "now_iso", "preflight_payload", "preflight_refusal", "print_places_gpus", "print_places_preflight",
    "print_gpus", "print_gpus_result", "print_ps", "print_refusal", "print_stop_report", "print_stop_reports",
    "ps_payload", "rule_line", "show_preflight", "shown", "step_line", "stop_payload", "verdict",
]
