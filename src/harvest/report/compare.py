"""The page of a compare folder: each quality metric with its interval against the floor's, per candidate.

Source: ``compare.json`` (the ``harvest.compare/1`` document :func:`harvest.campaign.sweep.compare.compare`
writes and ``harvest compare --json`` prints; the fields it shares with ``tune.json``, from ``out_dir``
to ``floor_source`` and ``launches``, ``notes``, are :class:`harvest.campaign.sweep.report.SweepReport`'s),
and each launch's ``stop.json`` (the full StopReport the supervisor wrote) for the stop details.
:func:`read_doc`, :func:`launch_entries` and :data:`METRICS` serve the tune page too. Only reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harvest.report import charts
from harvest.report.html import Cell, esc, figure, table, val
from harvest.report.run import launches_section

#: Quality metrics in the order the tables show them, with the label people read.
METRICS = (("top1_agreement", "top-1 agreement"), ("mean_kl", "mean KL"),
           ("mean_abs_delta_logprob", "mean |d logprob|"), ("p99_abs_delta_logprob", "p99 |d logprob|"),
           ("exact_match", "exact match"), ("mean_first_divergence", "mean first divergence"),
           ("task_score", "task score"))


def read_doc(folder: Path, name: str, schema: str) -> dict[str, Any]:
    path = folder / name
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        from harvest.errors import ConfigError

        raise ConfigError(str(path), [(str(path), f"unreadable: {exc}")]) from None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        from harvest.errors import ConfigError

        raise ConfigError(str(path), [(str(path), f"not a {schema} document")])
    return doc


def metric(quality: dict[str, Any] | None, name: str) -> tuple[float | None, float | None, float | None]:
    m = ((quality or {}).get("metrics") or {}).get(name) or {}
    return m.get("value"), m.get("low"), m.get("high")


def gate_limit(gates: list[dict[str, Any] | None], name: str) -> float | None:
    """The gate's limit for ``name`` (the same for every candidate: it is set from the floor)."""
    for g in gates:
        for c in (g or {}).get("checks") or []:
            if c.get("name") == name:
                return c.get("limit")
    return None


def launch_entries(launches: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """The document's launches, each with the full StopReport its server folder holds when there."""
    out = []
    for x in launches:
        stop = x.get("stop")
        run_dir = x.get("run_dir")
        if run_dir:
            for base in (Path(run_dir), folder / run_dir):
                try:
                    stop = json.loads((base / "stop.json").read_text(encoding="utf-8"))
                    break
                except (OSError, ValueError):
                    continue
        rec: dict[str, Any] = {}
        if run_dir:
            try:
                rec = json.loads((Path(run_dir) / "launch.json").read_text(encoding="utf-8"))["record"]
            except (OSError, ValueError, KeyError):
                pass
        out.append({"label": x.get("label"), "launched_at": rec.get("started_at"), "engine": rec.get("engine"),
                    "engine_version": rec.get("engine_version"), "pid": rec.get("pid"),
                    "ready_s": x.get("ready_s"), "kv_capacity_tokens": x.get("kv_capacity_tokens"), "stop": stop,
                    "error": x.get("error")})
    return out


def compare_page(folder: str | Path) -> tuple[str, str, list[str]]:
    folder = Path(folder)
    doc = read_doc(folder, "compare.json", "harvest.compare/1")
    rows = doc.get("rows") or []
    gates = [r.get("gate") for r in rows]
    floor_row = next((r for r in rows if r.get("label") == "floor"), None)
    present = [(k, name) for k, name in METRICS if any(metric(r.get("quality"), k)[0] is not None for r in rows)]
    panels = []
    for key, name in present:
        floor = metric(floor_row.get("quality"), key) if floor_row else None
        panels.append({"metric": name, "floor": floor, "limit": gate_limit(gates, key),
                       "rows": [(r["label"], *metric(r.get("quality"), key), r.get("verdict")) for r in rows]})
    sections = ["<h2>Comparison</h2>",
                table(("reference", "probe prompts", "noise floor from", "reference reused", "all passed"),
                      [(json.dumps(doc.get("reference"), sort_keys=True), Cell(val(doc.get("prompts"), "prompts"), True),
                        doc.get("floor_source"), "yes" if doc.get("reused_reference") else "no",
                        "yes" if doc.get("passed") else "no")])]
    if panels:
        sections.append(figure("metrics", charts.intervals(panels),
                               "Each metric with its bootstrap interval, per candidate; the shaded band is "
                               "the noise floor's interval (the reference against itself), the dashed line "
                               "the gate's limit."))
    else:
        sections.append("<p>No candidate was measured (every one was rejected, failed or not run).</p>")
    headers = ["server", "settings", "KV tokens", *[n for _, n in present], "stop", "verdict", "reasons"]
    body = []
    for i, r in enumerate(rows):
        cells: list[Any] = [r.get("label"), json.dumps(r.get("settings") or {}, sort_keys=True),
                            Cell(val((r.get("launch") or {}).get("kv_capacity_tokens"),
                                     f"rows.{i}.launch.kv_capacity_tokens" if r.get("launch") else None), True)]
        for key, _ in present:
            v, lo, hi = metric(r.get("quality"), key)
            has = bool(r.get("quality")) and key in r["quality"].get("metrics", {})
            shown = val(v, f"rows.{i}.quality.metrics.{key}.value" if has else None)
            if lo is not None:
                shown += f" [{val(lo, f'rows.{i}.quality.metrics.{key}.low')}, " \
                         f"{val(hi, f'rows.{i}.quality.metrics.{key}.high')}]"
            cells.append(Cell(shown, True))
        stop = ((r.get("launch") or {}).get("stop") or {}).get("verdict")
        cells += [stop, Cell(f'<b data-verdict="{esc(r.get("verdict"))}">{esc(r.get("verdict"))}</b>'),
                  "; ".join(r.get("reasons") or [])]
        body.append(cells)
    sections.append(table(headers, body, name="rows"))
    for note in doc.get("notes") or []:
        sections.append(f'<p class="warn">note: {esc(note)}</p>')
    sections.append(launches_section(launch_entries(doc.get("launches") or [], folder)))
    passed = sum(1 for r in rows if r.get("label") != "floor" and r.get("verdict") == "pass")
    candidates = sum(1 for r in rows if r.get("label") != "floor")
    return (f"harvest compare report: {folder.name}",
            f"{folder} - {passed} of {candidates} candidate(s) passed, {doc.get('prompts')} probe prompts", sections)


__all__ = ["METRICS", "compare_page", "gate_limit", "launch_entries", "metric", "read_doc"]
