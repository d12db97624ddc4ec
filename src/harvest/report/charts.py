"""The figures of ``harvest report``, drawn by :mod:`harvest.report.plot` and inlined in the page
as SVG.

Why SVG drawn here, and not Vega-Lite through altair with its JavaScript inlined, nor matplotlib:

- size: a figure here is a few KB to a few tens of KB of SVG, and a report a few hundred KB
  whatever the run's size; inlining vega, vega-lite and vega-embed adds ~800 KB of script to every
  page before any data, and the data itself travels as JSON beside it.
- fidelity: SVG is vector, so the page prints sharp at any size, and it renders with no script at
  all, so the page cannot make a request or fail in a browser's console (the browser tests check
  both). Text is kept as text: the numbers on the axes can be searched and copied.
- cost: every ``harvest run`` writes its report as it ends. matplotlib drew these until 2026-12-07:
  2.3-2.5 s of CPU a report on a 2-core VM (its import and its constrained layout), more than the
  rest of a small run; :mod:`harvest.report.plot` draws the same figures in milliseconds.

Each function takes plain numbers already read by the page modules (from ``run_status``,
timeline.json, tune.json or compare.json) and returns one ``<svg>`` element; none reads a file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harvest.report.plot import Axes, Figure, Scale, plain

VERDICT_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "rejected": "#bc4c00", "skipped": "#8c959f",
                  "failed": "#6e40c9", "not run": "#d0d7de", "floor": "#0b5cad"}
STATUS_COLORS = {"done": "#1a7f37", "truncated": "#bf8700", "failed": "#cf222e", "skipped": "#8c959f",
                 "pending": "#d0d7de", "running": "#0b5cad"}
PALETTE = ("#0b5cad", "#bc4c00", "#1a7f37", "#6e40c9", "#cf222e", "#bf8700", "#1b7c83", "#57606a")
#: A figure's width in points (9.5 inches), its height by what it holds.
WIDTH = 684.0


def _pt(inches: float) -> float:
    return inches * 72.0


def time_panels(panels: Sequence[dict[str, Any]], *, events: Sequence[tuple[float, str, str]] = (),
                spans: Sequence[tuple[float, float, str]] = (), xlabel: str = "minutes since the run started"
                ) -> str:
    """Stacked panels sharing the time axis. Each panel: ``{"title", "ylabel", "lines": [(label, xs,
    ys[, style])], "bars": [(label, xs, heights, width)]}``; None in ``ys`` breaks a line; ``style``:
    ``{"linestyle": "--"}`` (dashed) or ``":"`` (dotted). ``events`` are vertical lines (x, label,
    colour), ``spans`` shaded ranges (x0, x1, label)."""
    shared = Scale()
    fig = Figure(WIDTH, _pt(1.9 * len(panels) + 0.6), rows=len(panels),
                 axes=[Axes(x=shared, y=Scale(lo=0.0), legend=True, xticklabels=n == len(panels) - 1)
                       for n in range(len(panels))])
    for n, (ax, panel) in enumerate(zip(fig.axes, panels)):
        lines = panel.get("lines", ())
        for i, (label, xs, ys, *style) in enumerate(lines):
            # The first line listed is drawn on top (a later one equal to it must not hide it), and
            # keeps its label as the SVG id of its path.
            ax.line(xs, ys, label=label, color=PALETTE[i % len(PALETTE)], z=len(lines) - i, gid=f"line: {label}",
                    dash=(style[0].get("linestyle") if style else None))
        for i, (label, xs, heights, width) in enumerate(panel.get("bars", ())):
            ax.bars(xs, heights, [width] * len(xs) if isinstance(width, (int, float)) else width,
                    label=label, color=PALETTE[(i + 4) % len(PALETTE)])
        shown: set[str] = set() if n == 0 else {label for _, label, _ in events} | {s[2] for s in spans}
        for x, label, colour in events:
            ax.vline(x, color=colour, width=0.9, dash="--", label=label if label not in shown else None)
            shown.add(label)
        for x0, x1, label in spans:
            ax.vspan(x0, x1, color="#cf222e", alpha=0.12, label=label if label not in shown else None)
            shown.add(label)
        ax.title = panel["title"]
        ax.ylabel = panel.get("ylabel", "")
        if panel.get("ylim_top") is not None:
            ax.y.hi = float(panel["ylim_top"])
    fig.axes[-1].xlabel = xlabel
    return fig.svg()


def histograms(series: Sequence[tuple[str, Sequence[float], Sequence[int]]], *, title: str, xlabel: str,
               marks: Sequence[tuple[float, str]] = ()) -> str:
    """Log-binned histograms drawn as steps on a log x axis: (label, edges, counts) each; the first
    bin (below the histogram's lowest edge, zero included) is drawn one bin wide below that edge
    (where its values lie is not known: a wider bar would show values that are not there). The
    axis spans at least a decade, so the values of one bin (every answer ran to max_tokens) show as
    a bar, not as a fill of the whole width."""
    return histogram_figure(series, title=title, xlabel=xlabel, marks=marks).svg()


#: The narrowest span of a histogram's x axis: a decade (the used bins, centred).
MIN_SPAN = 10.0


def histogram_figure(series: Sequence[tuple[str, Sequence[float], Sequence[int]]], *, title: str, xlabel: str,
                     marks: Sequence[tuple[float, str]] = ()) -> Figure:
    """The figure :func:`histograms` draws (its axes' marks and limits readable)."""
    fig = Figure(WIDTH, _pt(2.8), axes=[Axes(x=Scale(log=True), y=Scale(lo=0.0), legend=True)])
    (ax,) = fig.axes
    spans: list[tuple[float, float]] = []
    for i, (label, edges, counts) in enumerate(series):
        if not sum(counts):
            continue
        lo = edges[1]
        ratio = edges[2] / edges[1] if len(edges) > 2 and edges[1] > 0 else 10.0
        xs = [lo / ratio if j == 0 else e for j, e in enumerate(edges)]
        used = [j for j, c in enumerate(counts) if c]
        first, last = used[0], used[-1]
        ax.stairs(counts[first:last + 1], xs[first:last + 2], label=f"{label} ({sum(counts):,})",
                  color=PALETTE[i % len(PALETTE)], fill=len(series) == 1, alpha=0.85)
        spans.append((xs[first], xs[last + 1]))
    for x, label in marks:
        ax.vline(x, color="#57606a", dash=":", width=1.0)
        ax.vlabel(x, label)  # inside the frame, left of its line, on a white ground
    if spans:
        ends = spans + [(x, x) for x, _ in marks if x > 0]
        lo, hi = min(a for a, _ in ends), max(b for _, b in ends)
        if hi / lo < MIN_SPAN:
            widen = math.sqrt(MIN_SPAN / (hi / lo))
            ax.x.lo, ax.x.hi = lo / widen, hi * widen
    ax.title, ax.xlabel, ax.ylabel = title, xlabel, "items"
    return fig


def hbars(labels: Sequence[str], values: Sequence[float], colors: Sequence[str], *, title: str, xlabel: str,
          notes: Sequence[str] | None = None) -> str:
    """Horizontal bars, first label on top, each annotated with its value (or its note)."""
    top = max(values, default=0) or 1.0
    fig = Figure(WIDTH, _pt(0.42 * len(labels) + 1.0),
                 axes=[Axes(x=Scale(lo=0.0, hi=top * 1.25), ycategories=list(labels), ygrid=False)])
    (ax,) = fig.axes
    ax.hbars(values, colors)
    shown: Sequence[str | None] = notes if notes is not None else [None] * len(values)
    n = len(labels)
    for i, (v, note) in enumerate(zip(values, shown)):
        ax.text(v + top * 0.01, n - 1 - i, note if note is not None else f"{v:,.0f}", dy=-3, size=8)
    ax.title, ax.xlabel = title, xlabel
    return fig.svg()


def metric_scatter(panels: Sequence[dict[str, Any]], *, ylabel: str) -> str:
    """One panel per quality metric: trials at (metric value with its interval, tok/s), coloured by
    verdict, the chosen one ringed; the noise floor's value and interval as a vertical band, the
    gate's limit dashed. Panel: ``{"metric", "points": [(value, low, high, y, verdict, label, best)],
    "floor": (value, low, high) | None, "limit": float | None}``."""
    cols = 2 if len(panels) > 1 else 1
    rows = max(math.ceil(len(panels) / cols), 1)
    fig = Figure(WIDTH, _pt(2.7 * rows + 0.4), rows=rows, cols=cols, legend_below=True,
                 axes=[Axes(y=Scale(lo=0.0)) for _ in range(rows * cols)])
    seen: set[str] = set()
    for ax, panel in zip(fig.axes, panels):
        floor = panel.get("floor")
        if floor is not None and floor[0] is not None:
            ax.vspan(floor[1], floor[2], color=VERDICT_COLORS["floor"], alpha=0.12,
                     label="noise floor" if "floor" not in seen else None)
            ax.vline(floor[0], color=VERDICT_COLORS["floor"], width=1.0)
            seen.add("floor")
        if panel.get("limit") is not None:
            ax.vline(panel["limit"], color="#57606a", dash="--", width=1.0,
                     label="gate limit" if "limit" not in seen else None)
            seen.add("limit")
        for value, low, high, y, verdict, label, best in panel["points"]:
            colour = VERDICT_COLORS.get(verdict, "#57606a")
            interval = low is not None and high is not None
            ax.point(value, y, color=colour, low=min(low, value) if interval else None,
                     high=max(high, value) if interval else None, label=verdict if verdict not in seen else None)
            seen.add(verdict)
            ax.text(value, y, label, dx=5, dy=4)
            if best:
                ax.point(value, y, color=colour, ring=True, label="chosen" if "chosen" not in seen else None)
                seen.add("chosen")
        ax.title, ax.ylabel = panel["metric"], ylabel
    for ax in fig.axes[len(panels):]:
        ax.visible = False
    return fig.svg()


def intervals(panels: Sequence[dict[str, Any]]) -> str:
    """One panel per metric: each row's value with its interval, the floor's interval as a band.
    Panel: ``{"metric", "rows": [(label, value, low, high, verdict)], "floor": (value, low, high) | None,
    "limit": float | None}``."""
    cols = 2 if len(panels) > 1 else 1
    rows_n = max(math.ceil(len(panels) / cols), 1)
    height = max(len(panels[0]["rows"]) if panels else 1, 1) * 0.35 + 1.2
    fig = Figure(WIDTH, _pt(height * rows_n + 0.4), rows=rows_n, cols=cols,
                 axes=[Axes(ygrid=False) for _ in range(rows_n * cols)])
    for ax, panel in zip(fig.axes, panels):
        labels = [r[0] for r in panel["rows"]]
        ax.ycategories = labels
        n = len(labels)
        floor = panel.get("floor")
        if floor is not None and floor[0] is not None:
            ax.vspan(floor[1], floor[2], color=VERDICT_COLORS["floor"], alpha=0.12)
            ax.vline(floor[0], color=VERDICT_COLORS["floor"], width=1.0)
        if panel.get("limit") is not None:
            ax.vline(panel["limit"], color="#57606a", dash="--", width=1.0)
        for i, (_label, value, low, high, verdict) in enumerate(panel["rows"]):
            if value is None:
                continue
            interval = low is not None and high is not None
            ax.point(value, n - 1 - i, color=VERDICT_COLORS.get(verdict, "#57606a"),
                     low=min(low, value) if interval else None, high=max(high, value) if interval else None)
        ax.title = panel["metric"]
    for ax in fig.axes[len(panels):]:
        ax.visible = False
    return fig.svg()


__all__ = ["MIN_SPAN", "PALETTE", "STATUS_COLORS", "VERDICT_COLORS", "hbars", "histogram_figure", "histograms",
           "intervals", "metric_scatter", "plain", "time_panels"]
