"""The figures of ``harvest report``, drawn with matplotlib and inlined in the page as SVG.

Why matplotlib to SVG, and not Vega-Lite through altair with its JavaScript inlined:

- size: a figure here is 20-60 KB of SVG, and a report a few hundred KB whatever the run's size;
  inlining vega, vega-lite and vega-embed adds ~800 KB of script to every page before any data,
  and the data itself travels as JSON beside it.
- fidelity: SVG is vector, so the page prints sharp at any size, and it renders with no script at
  all, so the page cannot make a request or fail in a browser's console (the browser tests check
  both). Text is kept as text (``svg.fonttype = none``): smaller than glyph paths, and the numbers
  on the axes can be searched and copied.
- matplotlib is the well-kept standard: the same call draws the same figure in a test, in CI and on
  a laptop, from the Object-oriented API (``Figure``, no pyplot: no global state, no GUI backend).

Each function takes plain numbers already read by the page modules (from ``run_status``,
timeline.json, tune.json or compare.json) and returns one ``<svg>`` element; none reads a file.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from typing import Any

from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

VERDICT_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "rejected": "#bc4c00", "skipped": "#8c959f",
                  "failed": "#6e40c9", "not run": "#d0d7de", "floor": "#0b5cad"}
STATUS_COLORS = {"done": "#1a7f37", "truncated": "#bf8700", "failed": "#cf222e", "skipped": "#8c959f",
                 "pending": "#d0d7de", "running": "#0b5cad"}
PALETTE = ("#0b5cad", "#bc4c00", "#1a7f37", "#6e40c9", "#cf222e", "#bf8700", "#1b7c83", "#57606a")

# Any: matplotlib types rc keys as a Literal of its ~400 names, which a dict literal does not keep.
_RC: Any = {"svg.fonttype": "none", "svg.hashsalt": "harvest-report", "font.size": 9,
       "font.family": "sans-serif", "axes.spines.top": False, "axes.spines.right": False,
       "axes.grid": True, "grid.color": "#e5e8eb", "grid.linewidth": 0.6, "axes.titlesize": 10,
       "axes.titleweight": "bold", "legend.fontsize": 8, "legend.frameon": False,
       "svg.image_inline": True}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    with rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return re.sub(r"\s+", " ", text[start:]).replace("> <", "><")


def _figure(width: float, height: float) -> Figure:
    with rc_context(_RC):
        return Figure(figsize=(width, height), layout="constrained")


def _subplots(fig: Figure, nrows: int, ncols: int = 1, **kw: Any) -> list[Any]:
    with rc_context(_RC):
        axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return [ax for row in axes for ax in row]


def time_panels(panels: Sequence[dict[str, Any]], *, events: Sequence[tuple[float, str, str]] = (),
                spans: Sequence[tuple[float, float, str]] = (), xlabel: str = "minutes since the run started"
                ) -> str:
    """Stacked panels sharing the time axis. Each panel: ``{"title", "ylabel", "lines": [(label, xs,
    ys[, style])], "bars": [(label, xs, heights, width)]}``; None in ``ys`` breaks a line; ``style``:
    matplotlib line keywords (``{"linestyle": "--"}``). ``events`` are
    vertical lines (x, label, colour), ``spans`` shaded ranges (x0, x1, label)."""
    fig = _figure(9.5, 1.9 * len(panels) + 0.6)
    axes = _subplots(fig, len(panels), sharex=True)
    for n, (ax, panel) in enumerate(zip(axes, panels)):
        lines = panel.get("lines", ())
        for i, (label, xs, ys, *style) in enumerate(lines):
            # The first line listed is drawn on top (a later one equal to it must not hide it), and
            # keeps its label as the SVG id (gid) of its path.
            ax.plot(xs, [math.nan if y is None else y for y in ys], label=label, linewidth=1.3,
                    color=PALETTE[i % len(PALETTE)], zorder=3 + len(lines) - i, gid=f"line: {label}",
                    **(style[0] if style else {}))
        for i, (label, xs, heights, width) in enumerate(panel.get("bars", ())):
            ax.bar(xs, heights, width=width, label=label, color=PALETTE[(i + 4) % len(PALETTE)], align="edge")
        shown: set[str] = set() if n == 0 else {label for _, label, _ in events} | {s[2] for s in spans}
        for x, label, colour in events:
            ax.axvline(x, color=colour, linewidth=0.9, linestyle="--",
                       label=label if label not in shown else None)
            shown.add(label)
        for x0, x1, label in spans:
            ax.axvspan(x0, x1, color="#cf222e", alpha=0.12, label=label if label not in shown else None)
            shown.add(label)
        ax.set_title(panel["title"], loc="left")
        ax.set_ylabel(panel.get("ylabel", ""))
        ax.set_ylim(bottom=0)
        if panel.get("ylim_top") is not None:
            ax.set_ylim(top=panel["ylim_top"])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1].set_xlabel(xlabel)
    return _svg(fig)


def histograms(series: Sequence[tuple[str, Sequence[float], Sequence[int]]], *, title: str, xlabel: str,
               marks: Sequence[tuple[float, str]] = ()) -> str:
    """Log-binned histograms drawn as steps on a log x axis: (label, edges, counts) each; the first
    bin (below the histogram's lowest edge, zero included) is drawn one bin wide below that edge
    (where its values lie is not known: a wider bar would show values that are not there). The
    axis spans at least a decade, so the values of one bin (every answer ran to max_tokens) show as
    a bar, not as a fill of the whole width."""
    return _svg(histogram_figure(series, title=title, xlabel=xlabel, marks=marks))


#: The narrowest span of a histogram's x axis: a decade (the used bins, centred).
MIN_SPAN = 10.0


def histogram_figure(series: Sequence[tuple[str, Sequence[float], Sequence[int]]], *, title: str, xlabel: str,
                     marks: Sequence[tuple[float, str]] = ()) -> Any:
    """The figure :func:`histograms` draws (a matplotlib Figure)."""
    fig = _figure(9.5, 2.8)
    (ax,) = _subplots(fig, 1)
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
                  color=PALETTE[i % len(PALETTE)], linewidth=1.4, fill=len(series) == 1, alpha=0.85)
        spans.append((xs[first], xs[last + 1]))
    for x, label in marks:
        ax.axvline(x, color="#57606a", linestyle=":", linewidth=1.0)
        # Inside the axes, left of its line, never clipped (constrained layout makes room for it).
        ax.annotate(label, (x, 0.98), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=7, color="#57606a", annotation_clip=False,
                    bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    ax.set_xscale("log")
    if spans:
        ends = spans + [(x, x) for x, _ in marks if x > 0]
        lo, hi = min(a for a, _ in ends), max(b for _, b in ends)
        if hi / lo < MIN_SPAN:
            widen = math.sqrt(MIN_SPAN / (hi / lo))
            ax.set_xlim(lo / widen, hi * widen)
    plain_log_axis(ax.xaxis)
    ax.set_title(title, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("items")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def plain(value: float) -> str:
    """A tick label as a person reads it: ``0.5``, ``2``, ``30``, ``1,000``, never ``2×10⁰``."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


def plain_log_axis(axis: Any) -> None:
    """A log axis labelled in plain numbers at 1, 2 and 5 of each decade, with no minor labels."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: plain(x)))
    axis.set_minor_formatter(NullFormatter())


def hbars(labels: Sequence[str], values: Sequence[float], colors: Sequence[str], *, title: str, xlabel: str,
          notes: Sequence[str] | None = None) -> str:
    """Horizontal bars, first label on top, each annotated with its value (or its note)."""
    fig = _figure(9.5, 0.42 * len(labels) + 1.0)
    (ax,) = _subplots(fig, 1)
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color=colors, height=0.7)
    top = max(values, default=0) or 1.0
    shown: Sequence[str | None] = notes if notes is not None else [None] * len(values)
    for y, v, note in zip(ys, values, shown):
        ax.text(v + top * 0.01, y, note if note is not None else f"{v:,.0f}", va="center", fontsize=8)
    ax.set_yticks(ys, labels)
    ax.set_xlim(0, top * 1.25)
    ax.set_title(title, loc="left")
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", visible=False)
    return _svg(fig)


def metric_scatter(panels: Sequence[dict[str, Any]], *, ylabel: str) -> str:
    """One panel per quality metric: trials at (metric value with its interval, tok/s), coloured by
    verdict, the chosen one ringed; the noise floor's value and interval as a vertical band, the
    gate's limit dashed. Panel: ``{"metric", "points": [(value, low, high, y, verdict, label, best)],
    "floor": (value, low, high) | None, "limit": float | None}``."""
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig = _figure(9.5, 2.7 * rows + 0.4)
    axes = _subplots(fig, rows, cols)
    seen: set[str] = set()
    for ax, panel in zip(axes, panels):
        floor = panel.get("floor")
        if floor is not None and floor[0] is not None:
            ax.axvspan(floor[1], floor[2], color=VERDICT_COLORS["floor"], alpha=0.12,
                       label="noise floor" if "floor" not in seen else None)
            ax.axvline(floor[0], color=VERDICT_COLORS["floor"], linewidth=1.0)
            seen.add("floor")
        if panel.get("limit") is not None:
            ax.axvline(panel["limit"], color="#57606a", linestyle="--", linewidth=1.0,
                       label="gate limit" if "limit" not in seen else None)
            seen.add("limit")
        for value, low, high, y, verdict, label, best in panel["points"]:
            colour = VERDICT_COLORS.get(verdict, "#57606a")
            err = [[max(value - low, 0)], [max(high - value, 0)]] if low is not None and high is not None else None
            ax.errorbar([value], [y], xerr=err, fmt="o", color=colour, markersize=6, capsize=3,
                        label=verdict if verdict not in seen else None)
            seen.add(verdict)
            ax.annotate(label, (value, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
            if best:
                ax.plot([value], [y], marker="o", markersize=14, markerfacecolor="none",
                        markeredgecolor="#1b1f24", linewidth=0, label="chosen" if "chosen" not in seen else None)
                seen.add("chosen")
        ax.set_title(panel["metric"], loc="left")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles, labels = [], []
    for ax in axes[:len(panels)]:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 7))
    return _svg(fig)


def intervals(panels: Sequence[dict[str, Any]]) -> str:
    """One panel per metric: each row's value with its interval, the floor's interval as a band.
    Panel: ``{"metric", "rows": [(label, value, low, high, verdict)], "floor": (value, low, high) | None,
    "limit": float | None}``."""
    cols = 2 if len(panels) > 1 else 1
    rows_n = math.ceil(len(panels) / cols)
    height = max(len(panels[0]["rows"]) if panels else 1, 1) * 0.35 + 1.2
    fig = _figure(9.5, height * rows_n + 0.4)
    axes = _subplots(fig, rows_n, cols)
    for ax, panel in zip(axes, panels):
        labels = [r[0] for r in panel["rows"]]
        ys = list(range(len(labels)))[::-1]
        floor = panel.get("floor")
        if floor is not None and floor[0] is not None:
            ax.axvspan(floor[1], floor[2], color=VERDICT_COLORS["floor"], alpha=0.12)
            ax.axvline(floor[0], color=VERDICT_COLORS["floor"], linewidth=1.0)
        if panel.get("limit") is not None:
            ax.axvline(panel["limit"], color="#57606a", linestyle="--", linewidth=1.0)
        for y, (_label, value, low, high, verdict) in zip(ys, panel["rows"]):
            if value is None:
                continue
            err = [[max(value - low, 0)], [max(high - value, 0)]] if low is not None and high is not None else None
            ax.errorbar([value], [y], xerr=err, fmt="o", color=VERDICT_COLORS.get(verdict, "#57606a"),
                        capsize=3, markersize=6)
        ax.set_yticks(ys, labels)
        ax.set_ylim(-0.6, len(labels) - 0.4)
        ax.set_title(panel["metric"], loc="left")
        ax.grid(axis="y", visible=False)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _svg(fig)


__all__ = ["PALETTE", "STATUS_COLORS", "VERDICT_COLORS", "hbars", "histograms", "intervals",
           "metric_scatter", "time_panels"]
