"""The page of a tune folder: what each setting bought in tok/s against what it cost in quality.

Source: ``tune.json`` (the ``harvest.tune/1`` document :func:`harvest.campaign.sweep.tune.write_results`
writes and ``harvest tune --json`` prints; the fields it shares with ``compare.json`` are
:class:`harvest.campaign.sweep.report.SweepReport`'s, read with :mod:`harvest.report.compare`'s helpers),
plus each launch's ``stop.json`` for the stop details.
Every verdict class is shown: pass, fail (quality gate), rejected (policy; never launched), skipped
(memory order; never launched), failed (launch, probe or stop), not run. Only reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harvest.campaign.sweep.report import TRIAL_VERDICTS
from harvest.report import charts
from harvest.report.compare import METRICS, gate_limit, launch_entries, metric, read_doc
from harvest.report.html import Cell, esc, figure, table, val
from harvest.report.run import launches_section



def _settings(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={' '.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in overrides.items()) or "(the job's settings)"


def tune_page(folder: str | Path) -> tuple[str, str, list[str]]:
    """The page of a tune folder: (title, subtitle, sections)."""
    folder = Path(folder)
    doc = read_doc(folder, "tune.json", "harvest.tune/1")
    trials = doc.get("trials") or []
    best = doc.get("best")
    floor = doc.get("floor")
    present = [(k, name) for k, name in METRICS if any(metric(t.get("quality"), k)[0] is not None for t in trials)]
    sections = _sweep(doc, trials, best)
    sections.append(_quality_figure(trials, present, floor, best))
    if trials:
        sections.append(_trials_figure(trials, best))
    sections.append("<h2>Trials</h2>" + _trials_table(trials, present, best))
    for note in doc.get("notes") or []:
        sections.append(f'<p class="warn">note: {esc(note)}</p>')
    for note in (floor or {}).get("notes") or []:
        sections.append(f'<p class="sub">floor note: {esc(note)}</p>')
    sections.append(launches_section(launch_entries(doc.get("launches") or [], folder)))
    chosen = next((t for t in trials if t.get("index") == best), None)
    subtitle = (f"{folder} - {len(trials)} trials; chosen: "
                + (f"#{best} {_settings(chosen.get('overrides') or {})}" if chosen else "none passed"))
    return f"harvest tune report: {folder.name}", subtitle, sections


def _sweep(doc: dict[str, Any], trials: list[dict[str, Any]], best: Any) -> list[str]:
    """The sweep's own facts (reference, probe prompts, floor, chosen) and the trials per verdict."""
    sections = ["<h2>Sweep</h2>",
                table(("reference", "probe prompts", "noise floor from", "reference reused", "aborted", "chosen"),
                      [(json.dumps(doc.get("reference"), sort_keys=True), Cell(val(doc.get("prompts"), "prompts"), True),
                        doc.get("floor_source"), "yes" if doc.get("reused_reference") else "no",
                        "yes" if doc.get("aborted") else "no",
                        Cell(f'<b data-json="best">{esc(best)}</b>' if best is not None else "none passed"))])]
    counts = {v: sum(1 for t in trials if t.get("verdict") == v) for v in TRIAL_VERDICTS}
    sections.append("<p>" + ", ".join(f"{n} {esc(v)}" for v, n in counts.items() if n) + ".</p>")
    return sections


def _quality_figure(trials: list[dict[str, Any]], present: list[tuple[str, str]], floor: Any,
                    best: Any) -> str:
    """tok/s against each quality metric, one panel per metric: the measured trials."""
    gates = [t.get("gate") for t in trials]
    panels = []
    for key, name in present:
        points = []
        for t in trials:
            v, lo, hi = metric(t.get("quality"), key)
            tok = (t.get("throughput") or {}).get("gen_tok_s")
            if v is None or tok is None:
                continue
            points.append((v, lo, hi, tok, t.get("verdict"), f"#{t.get('index')}", t.get("index") == best))
        panels.append({"metric": name, "points": points, "floor": metric(floor, key) if floor else None,
                       "limit": gate_limit(gates, key)})
    if not any(p["points"] for p in panels):
        return "<p>No trial has both a quality and a throughput measurement.</p>"
    return figure("tok-vs-quality", charts.metric_scatter(panels, ylabel="gen tok/s"),
                  "Generation tok/s against each quality metric (bootstrap interval as the "
                  "horizontal bar). Shaded: the noise floor (reference against itself); dashed: "
                  "the gate's limit; ringed: the chosen setting.")


def _trials_figure(trials: list[dict[str, Any]], best: Any) -> str:
    """Every trial, whatever its verdict: a tok/s bar (0 when never measured), verdict and reason."""
    labels = [f"#{t.get('index')} {_settings(t.get('overrides') or {})}"[:60] for t in trials]
    values = [float((t.get("throughput") or {}).get("gen_tok_s") or 0.0) for t in trials]
    notes = []
    for t, v in zip(trials, values):
        why = (t.get("reasons") or [""])[0]
        text = f"{v:,.1f} tok/s - {t.get('verdict')}" if v else t.get("verdict") or "-"
        if t.get("verdict") != "pass" and why:
            text += f": {why[:70]}"
        if t.get("index") == best:
            text += "  (chosen)"
        notes.append(text)
    verdicts: list[Any] = [t.get("verdict") for t in trials]  # as tune.json has them; unknown: grey
    chart = charts.hbars(labels, values, [charts.VERDICT_COLORS.get(v, "#57606a") for v in verdicts],
                         title="every trial: gen tok/s and verdict", xlabel="gen tok/s", notes=notes)
    return figure("trials", chart, "Trials never launched (rejected by policy, skipped by memory order, "
                  "not run) have no bar, only their verdict.")


def _trials_table(trials: list[dict[str, Any]], present: list[tuple[str, str]], best: Any) -> str:
    """One row per trial: settings, KV tokens, throughput, each quality metric, stop and verdict;
    each measured cell names the JSON path it came from."""
    headers = ["#", "settings", "KV tokens", "peak running", "gen tok/s", *[n for _, n in present], "stop",
               "verdict", "reason"]
    body, classes = [], []
    for i, t in enumerate(trials):
        body.append(_trial_row(i, t, present, best))
        classes.append("best" if t.get("index") == best else "")
    return table(headers, body, row_classes=classes, name="trials")


def _trial_row(i: int, t: dict[str, Any], present: list[tuple[str, str]], best: Any) -> list[Any]:
    tp = t.get("throughput") or {}
    kv = tp.get("kv_capacity_tokens")
    kv_path: str | None = f"trials.{i}.throughput.kv_capacity_tokens" if tp else None
    if kv is None and t.get("launch"):
        kv = t["launch"].get("kv_capacity_tokens")
        kv_path = f"trials.{i}.launch.kv_capacity_tokens"
    tp_path = f"trials.{i}.throughput" if tp else None
    q_path = f"trials.{i}.quality.metrics" if t.get("quality") else None
    mark = " &#9733; chosen" if t.get("index") == best else ""
    ref = " (reference)" if t.get("is_reference") else ""
    cells: list[Any] = [Cell(f'{val(t.get("index"), f"trials.{i}.index")}{mark}{ref}'),
                        _settings(t.get("overrides") or {}),
                        Cell(val(kv, kv_path), True),
                        Cell(val(tp.get("peak_running"), tp_path and f"{tp_path}.peak_running"), True),
                        Cell(val(tp.get("gen_tok_s"), tp_path and f"{tp_path}.gen_tok_s"), True)]
    for key, _ in present:
        has = q_path and key in t["quality"]["metrics"]
        cells.append(Cell(val(metric(t.get("quality"), key)[0], f"{q_path}.{key}.value" if has else None),
                          True))
    stop = ((t.get("launch") or {}).get("stop") or {}).get("verdict")
    cells += [stop, Cell(f'<b data-verdict="{esc(t.get("verdict"))}">{esc(t.get("verdict"))}</b>'),
              "; ".join(t.get("reasons") or [])]
    return cells


__all__ = ["tune_page"]
