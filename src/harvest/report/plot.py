"""A small SVG plotter for the report's figures: axes on linear or log scales with ticks a person
reads, lines, steps, bars, bands, points with intervals, text marks and legends, laid out in a grid
and written as one ``<svg>`` element with its text kept as text.

Why not matplotlib, which drew these figures until 2026-12-07: its import and the constrained
layout of a run report's four figures cost 2.3-2.5 s of CPU at the end of every ``harvest run`` on
a 2-core VM (import 1.25 s, drawing 1.1 s, two thirds of it the layout measuring every text), more
than the rest of a small run; here a report's figures take a few milliseconds and the import none.
The report needs a dozen kinds of mark and no more.

Layout without a font: a text's width is estimated from per-character widths of a common
sans-serif face (DejaVu Sans, the widest of those named in :data:`FAMILY`), so a margin sized from
it fits the label in any of them; labels placed at a point are anchored there (``text-anchor``)
and need no width at all. Every coordinate comes from the data and the figure's size: the same
call writes the same bytes (clip ids are derived from the drawing itself), so a report can be
compared with the one before it.

Structure a reader (or a test) can find: each axes is ``<g id="axes_N">``, its ticks ``<g
id="xtick_K">``/``<g id="ytick_K">`` (a ``<line>`` and a ``<text>``), its legend ``<g
id="legend_N">``, a labelled line ``<g id="line: LABEL"><path d="M x y L x y ..."/></g>``.
Pure functions of plain numbers: nothing here reads a file.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from harvest.redact import escape_controls

#: Text sizes (the SVG's user unit: a point of a 684-point-wide figure).
FONT, SMALL, TINY, TITLE = 9.0, 8.0, 7.0, 10.0
FAMILY = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK, GREY, GRID = "#1b1f24", "#57606a", "#e5e8eb"
TICK = 3.5  # tick mark length, outward
DASHES = {"--": "5,2", ":": "1.5,2.5", "-.": "5,2,1.5,2"}

_NARROW = frozenset(" il.,:;'|!`()[]{}jfItr/-\"")
_WIDE = frozenset("mwMW@%")


def text_width(text: str, size: float) -> float:
    """The width a text takes in a sans-serif face at ``size``, estimated from its characters
    (DejaVu Sans's advances, the widest common face; generous by design)."""
    em = 0.0
    for ch in text:
        if ch in _NARROW:
            em += 0.34
        elif ch in _WIDE:
            em += 0.95
        elif ch.isupper():
            em += 0.72
        elif ch.isdigit():
            em += 0.64
        else:
            em += 0.62
    return em * size


def plain(value: float) -> str:
    """A tick label as a person reads it: ``0.5``, ``2``, ``30``, ``1,000``, never ``2×10⁰``."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


def _esc(text: str) -> str:
    """Text for an SVG text node or a double-quoted attribute: controls and bidi overrides shown
    escaped (as everywhere on the page), markup characters as entities."""
    return (escape_controls(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _n(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if math.isfinite(v) else "0"


def _finite(v: float | None) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


# --- scales ---------------------------------------------------------------------------------------


@dataclass
class Scale:
    """One axis's mapping from data to position: linear or log, limits from the data seen (with a
    margin of 5 % of the span, as plotting libraries do) unless fixed."""

    log: bool = False
    lo: float | None = None  # fixed limits (None: from the data)
    hi: float | None = None
    floor: float | None = None  # a margin never goes below this (bars stand on 0)
    dmin: float = math.inf
    dmax: float = -math.inf

    def see(self, *values: float | None) -> None:
        for v in values:
            if v is not None and _finite(v) and (not self.log or v > 0):
                self.dmin = min(self.dmin, float(v))
                self.dmax = max(self.dmax, float(v))

    def limits(self) -> tuple[float, float]:
        lo, hi = self.dmin, self.dmax
        if lo > hi:  # nothing seen
            lo, hi = (1.0, 10.0) if self.log else (0.0, 1.0)
        if self.log:
            a, b = math.log10(lo), math.log10(hi)
            if a == b:
                a, b = a - 0.5, b + 0.5
            pad = 0.05 * (b - a)
            lo, hi = 10 ** (a - pad), 10 ** (b + pad)
        else:
            if lo == hi:
                d = abs(lo) * 0.05 or 0.5
                lo, hi = lo - d, hi + d
            pad = 0.05 * (hi - lo)
            lo, hi = lo - pad, hi + pad
        if self.floor is not None and self.dmin >= self.floor:
            lo = max(lo, self.floor)
        lo = self.lo if self.lo is not None else lo
        hi = self.hi if self.hi is not None else hi
        if self.hi is None and self.lo is not None and not self.log and self.dmax <= self.lo:
            hi = self.lo + 1.0  # a fixed bottom and nothing above it
        if hi <= lo:
            hi = lo * 10 if self.log else lo + 1.0
        return lo, hi

    def mapping(self) -> Callable[[float], float]:
        """Data to the fraction of the axis (0 at its low limit, 1 at its high one), the limits read
        once: a line of thousands of points maps each without recomputing them."""
        lo, hi = self.limits()
        if self.log:
            a, span = math.log10(lo), math.log10(hi) - math.log10(lo)
            return lambda v: (math.log10(max(v, 1e-300)) - a) / span
        return lambda v: (v - lo) / (hi - lo)

    def ticks(self, length: float, spacing: float = 55.0) -> list[tuple[float, str]]:
        """Ticks at most one per ``spacing`` points of an axis ``length`` long."""
        lo, hi = self.limits()
        most = max(2, int(length // spacing))
        if self.log:
            found = _log_ticks(lo, hi, most)
            if len(found) >= 2:
                return found
        return _linear_ticks(lo, hi, max(2, min(most, 8)))


def _linear_ticks(lo: float, hi: float, count: int) -> list[tuple[float, str]]:
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if round(step / mag, 3) == 2.5 else 0)
    out = []
    k = math.ceil(lo / step - 1e-9)
    while k * step <= hi + step * 1e-9:
        v = round(k * step, 12)
        out.append((v, f"{v:,.0f}" if decimals == 0 and abs(v) >= 1000 else f"{v:.{decimals}f}"))
        k += 1
    return out


def _log_ticks(lo: float, hi: float, most: int) -> list[tuple[float, str]]:
    """1, 2 and 5 of each decade; fewer where they would crowd the axis (decades, every other
    decade...), never fewer than two while two can be had."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    chosen: list[float] = []
    for subs, every in (((1, 2, 5), 1), ((1,), 1), ((1,), 2), ((1,), 5), ((1,), 10)):
        vals = [s * 10.0 ** d for d in range(first, last + 1) if d % every == 0 for s in subs]
        vals = [v for v in vals if lo * 0.9999 <= v <= hi * 1.0001]
        if len(vals) < 2 and chosen:
            break
        chosen = vals
        if len(vals) <= most:
            break
    return [(v, plain(float(f"{v:.6g}"))) for v in chosen]


# --- axes -----------------------------------------------------------------------------------------


@dataclass
class Mark:
    """One thing drawn in data coordinates; ``kind`` says which fields it uses."""

    kind: str
    color: str = INK
    xs: Sequence[float | None] = ()  # a line's points, bars' left edges
    ys: Sequence[float | None] = ()  # a line's points, bars' heights
    widths: Sequence[float] = ()  # bars' widths
    edges: Sequence[float] = ()  # steps
    counts: Sequence[float] = ()
    x: float = 0.0  # a vertical line, a point, a text, a horizontal bar's value, a band's start
    y: float = 0.0  # a point, a text, a horizontal bar's row
    x1: float = 0.0  # a band's end; a horizontal bar's thickness
    dx: float = 0.0  # a text's offset in points, dy up
    dy: float = 0.0
    label: str | None = None
    gid: str | None = None
    width: float = 1.3
    dash: str | None = None
    alpha: float = 1.0
    fill: bool = False
    text: str = ""
    size: float = TINY
    low: float | None = None
    high: float | None = None
    ring: bool = False
    z: int = 0


@dataclass
class Entry:
    """A legend entry: its text and a sample of the mark."""

    label: str
    kind: Literal["line", "patch", "point", "ring"]
    color: str
    dash: str | None = None
    alpha: float = 1.0


@dataclass
class Axes:
    """One panel: a frame with its scales, marks, labels and legend."""

    x: Scale = field(default_factory=Scale)
    y: Scale = field(default_factory=Scale)
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    xgrid: bool = True
    ygrid: bool = True
    xticklabels: bool = True  # off for an upper panel sharing its x axis
    ycategories: Sequence[str] | None = None  # a label at y = len-1 .. 0, top to bottom
    legend: bool = False  # an own legend right of the frame
    marks: list[Mark] = field(default_factory=list)
    visible: bool = True

    @property
    def xlim(self) -> tuple[float, float]:
        return self.x.limits()

    def line(self, xs: Sequence[float], ys: Sequence[float | None], *, color: str, label: str | None = None,
             width: float = 1.3, dash: str | None = None, gid: str | None = None, z: int = 0) -> None:
        """A line through the points; a None or NaN y breaks it."""
        self.marks.append(Mark("line", color, xs=list(xs), ys=list(ys), label=label, width=width, dash=dash,
                               gid=gid, z=z))
        self.x.see(*xs)
        self.y.see(*ys)

    def stairs(self, counts: Sequence[float], edges: Sequence[float], *, color: str, label: str | None = None,
               fill: bool = False, alpha: float = 1.0, width: float = 1.4) -> None:
        """Steps: ``counts[i]`` from ``edges[i]`` to ``edges[i + 1]``, down to 0 at both ends."""
        self.marks.append(Mark("stairs", color, edges=list(edges), counts=list(counts), label=label, fill=fill,
                               alpha=alpha, width=width))
        self.x.see(*edges)
        self.y.see(0, *counts)
        self.y.floor = 0.0

    def bars(self, xs: Sequence[float], heights: Sequence[float], widths: Sequence[float], *, color: str,
             label: str | None = None) -> None:
        """Vertical bars from 0, each from its x to x + width."""
        self.marks.append(Mark("bars", color, xs=list(xs), ys=list(heights), widths=list(widths), label=label))
        self.x.see(*xs, *(x + w for x, w in zip(xs, widths)))
        self.y.see(0, *heights)
        self.y.floor = 0.0

    def hbars(self, values: Sequence[float], colors: Sequence[str], *, height: float = 0.7) -> None:
        """Horizontal bars from 0, one per category, the first on top."""
        n = len(values)
        for i, (v, c) in enumerate(zip(values, colors)):
            self.marks.append(Mark("hbar", c, x=v, y=n - 1 - i, x1=height))
        self.x.see(0, *values)

    def vline(self, x: float, *, color: str, width: float = 1.0, dash: str | None = None,
              label: str | None = None) -> None:
        self.marks.append(Mark("vline", color, x=x, width=width, dash=dash, label=label))
        self.x.see(x)

    def vspan(self, x0: float, x1: float, *, color: str, alpha: float = 0.12, label: str | None = None) -> None:
        self.marks.append(Mark("vspan", color, x=x0, x1=x1, alpha=alpha, label=label))
        self.x.see(x0, x1)

    def point(self, x: float, y: float, *, color: str, low: float | None = None, high: float | None = None,
              label: str | None = None, ring: bool = False) -> None:
        """A dot with its interval (``low``..``high`` on x, capped), ringed when ``ring``."""
        self.marks.append(Mark("point", color, x=x, y=y, low=low, high=high, label=label, ring=ring))
        self.x.see(x, low, high)
        self.y.see(y)

    def text(self, x: float, y: float, text: str, *, dx: float = 0.0, dy: float = 0.0, size: float = TINY,
             color: str = INK) -> None:
        """A label at a data point, offset by (dx, dy) points (dy up), left-aligned."""
        self.marks.append(Mark("text", color, x=x, y=y, text=text, size=size, dx=dx, dy=dy))

    def vlabel(self, x: float, text: str, *, color: str = GREY, size: float = TINY) -> None:
        """A label along a vertical line at ``x``: reading upwards, just left of it, its end near
        the top of the frame, on a white ground; always inside the frame's height."""
        self.marks.append(Mark("vlabel", color, x=x, text=text, size=size))

    def entries(self) -> list[Entry]:
        out: list[Entry] = []
        for m in self.marks:
            if m.label is None:
                continue
            if m.kind == "line" or m.kind == "vline" or (m.kind == "stairs" and not m.fill):
                out.append(Entry(m.label, "line", m.color, m.dash))
            elif m.kind == "point":
                out.append(Entry(m.label, "ring" if m.ring else "point", m.color))
            else:
                out.append(Entry(m.label, "patch", m.color, alpha=m.alpha if m.kind == "vspan" else
                                 (0.85 if m.kind == "stairs" else 1.0)))
        return out

    # -- drawing --

    def yticks(self, length: float) -> list[tuple[float, str]]:
        if self.ycategories is not None:
            n = len(self.ycategories)
            return [(n - 1 - i, label) for i, label in enumerate(self.ycategories)]
        return self.y.ticks(length, 30.0)

    def needs(self, height: float) -> tuple[float, float, float, float]:
        """Room around the frame: left, right, top, bottom."""
        labels = [t for _, t in self.yticks(height)]
        left = max((text_width(t, FONT) for t in labels), default=0.0) + TICK + 5 + (FONT + 6 if self.ylabel else 0)
        right = (legend_width(self.entries()) + 14) if self.legend and self.entries() else 10.0
        top = TITLE + 9 if self.title else 6.0
        bottom = (FONT + TICK + 6 if self.xticklabels else TICK + 2) + (FONT + 5 if self.xlabel and
                                                                         self.xticklabels else 0)
        return left, right, top, bottom

    def draw(self, out: list[str], index: int, box: tuple[float, float, float, float], clip: str) -> None:
        x0, y0, w, h = box
        xf, yf = self.x.mapping(), self.y.mapping()
        fx = lambda v: x0 + xf(v) * w  # noqa: E731 - two one-line mappings
        if self.ycategories is not None:
            n = len(self.ycategories)
            fy: Callable[[float], float] = lambda v: y0 + h - (v + 0.6) / n * h  # noqa: E731
        else:
            fy = lambda v: y0 + h - yf(v) * h  # noqa: E731
        out.append(f'<g id="axes_{index}">')
        xt = [(v, t) for v, t in self.x.ticks(w) if -1e-6 <= xf(v) <= 1 + 1e-6]
        yt = [(v, t) for v, t in self.yticks(h) if self.ycategories is not None or -1e-6 <= yf(v) <= 1 + 1e-6]
        if self.xgrid:
            out.extend(f'<line x1="{_n(fx(v))}" y1="{_n(y0)}" x2="{_n(fx(v))}" y2="{_n(y0 + h)}" stroke="{GRID}" '
                       'stroke-width="0.6"/>' for v, _ in xt)
        if self.ygrid:
            out.extend(f'<line x1="{_n(x0)}" y1="{_n(fy(v))}" x2="{_n(x0 + w)}" y2="{_n(fy(v))}" stroke="{GRID}" '
                       'stroke-width="0.6"/>' for v, _ in yt)
        # Lines, steps, bars and bands are clipped to the frame; points (their limits hold them)
        # and texts are not: a ring or a label at the edge shows whole.
        ordered = sorted(self.marks, key=lambda m: m.z)
        out.append(f'<g clip-path="url(#{clip})">')
        for m in ordered:
            if m.kind not in _UNCLIPPED:
                _draw_mark(out, m, fx, fy, y0, h)
        out.append("</g>")
        for m in ordered:
            if m.kind in _UNCLIPPED:
                _draw_mark(out, m, fx, fy, y0, h)
        out.append(f'<path d="M {_n(x0)} {_n(y0)} L {_n(x0)} {_n(y0 + h)} L {_n(x0 + w)} {_n(y0 + h)}" '
                   f'fill="none" stroke="{INK}" stroke-width="0.8"/>')
        for k, (v, t) in enumerate(xt):
            px = _n(fx(v))
            label = (f'<text x="{px}" y="{_n(y0 + h + TICK + 2 + FONT * 0.8)}" text-anchor="middle">{_esc(t)}</text>'
                     if self.xticklabels else "")
            out.append(f'<g id="xtick_{k}"><line x1="{px}" y1="{_n(y0 + h)}" x2="{px}" y2="{_n(y0 + h + TICK)}" '
                       f'stroke="{INK}" stroke-width="0.8"/>{label}</g>')
        for k, (v, t) in enumerate(yt):
            py = _n(fy(v))
            out.append(f'<g id="ytick_{k}"><line x1="{_n(x0 - TICK)}" y1="{py}" x2="{_n(x0)}" y2="{py}" stroke="{INK}" '
                       f'stroke-width="0.8"/><text x="{_n(x0 - TICK - 2.5)}" y="{py}" dy="0.35em" '
                       f'text-anchor="end">{_esc(t)}</text></g>')
        for m in self.marks:  # labels above everything, unclipped
            if m.kind == "vlabel":
                _draw_vlabel(out, m, fx(m.x), y0, h)
        if self.title:
            out.append(f'<text x="{_n(x0)}" y="{_n(y0 - 6)}" font-size="{_n(TITLE)}" font-weight="bold">'
                       f"{_esc(self.title)}</text>")
        if self.xlabel and self.xticklabels:
            out.append(f'<text x="{_n(x0 + w / 2)}" y="{_n(y0 + h + TICK + 2 + FONT * 2 + 4)}" '
                       f'text-anchor="middle">{_esc(self.xlabel)}</text>')
        if self.ylabel:
            width = max((text_width(t, FONT) for _, t in yt), default=0.0)
            lx, ly = x0 - TICK - 5 - width - 4, y0 + h / 2
            out.append(f'<text transform="translate({_n(lx)},{_n(ly)}) rotate(-90)" text-anchor="middle">'
                       f"{_esc(self.ylabel)}</text>")
        if self.legend and self.entries():
            draw_legend(out, index, self.entries(), x0 + w + 10, y0, columns=1)
        out.append("</g>")


_UNCLIPPED = frozenset({"point", "text"})


def _segments(xs: Sequence[float | None], ys: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys):
        if x is not None and y is not None and _finite(x) and _finite(y):
            runs[-1].append((float(x), float(y)))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _stroke(m: Mark) -> str:
    dash = f' stroke-dasharray="{DASHES[m.dash]}"' if m.dash in DASHES else ""
    return f'stroke="{m.color}" stroke-width="{_n(m.width)}"{dash}'


def _draw_mark(out: list[str], m: Mark, fx: Callable[[float], float], fy: Callable[[float], float],
               y0: float, h: float) -> None:
    if m.kind == "line":
        d = " ".join("M " + " L ".join(f"{_n(fx(x))} {_n(fy(y))}" for x, y in run)
                     for run in _segments(m.xs, m.ys))
        if d:
            gid = f' id="{_esc(m.gid)}"' if m.gid else ""
            out.append(f'<g{gid}><path d="{d}" fill="none" {_stroke(m)} stroke-linejoin="round"/></g>')
    elif m.kind == "stairs":
        pts = [(m.edges[0], 0.0)]
        for i, c in enumerate(m.counts):
            pts += [(m.edges[i], c), (m.edges[i + 1], c)]
        pts.append((m.edges[len(m.counts)], 0.0))
        d = "M " + " L ".join(f"{_n(fx(x))} {_n(fy(y))}" for x, y in pts)
        fill = f'fill="{m.color}" fill-opacity="{_n(m.alpha)}"' if m.fill else 'fill="none"'
        out.append(f'<path d="{d}" {fill} stroke="{m.color}" stroke-opacity="{_n(m.alpha)}" '
                   f'stroke-width="{_n(m.width)}" stroke-linejoin="miter"/>')
    elif m.kind == "bars":
        for x, hgt, wd in zip(m.xs, m.ys, m.widths):
            if x is None or hgt is None or not (_finite(x) and _finite(hgt)) or not hgt:
                continue
            a, b = sorted((fx(x), fx(x + wd)))
            top, base = sorted((fy(hgt), fy(0.0)))
            out.append(f'<rect x="{_n(a)}" y="{_n(top)}" width="{_n(max(b - a, 0.5))}" height="{_n(base - top)}" '
                       f'fill="{m.color}"/>')
    elif m.kind == "hbar":
        a, b = sorted((fx(0.0), fx(m.x)))
        top, bottom = sorted((fy(m.y + m.x1 / 2), fy(m.y - m.x1 / 2)))
        out.append(f'<rect x="{_n(a)}" y="{_n(top)}" width="{_n(b - a)}" height="{_n(bottom - top)}" '
                   f'fill="{m.color}"/>')
    elif m.kind == "vline":
        at = _n(fx(m.x))
        out.append(f'<line x1="{at}" y1="{_n(y0)}" x2="{at}" y2="{_n(y0 + h)}" {_stroke(m)}/>')
    elif m.kind == "vspan":
        a, b = sorted((fx(m.x), fx(m.x1)))
        out.append(f'<rect x="{_n(a)}" y="{_n(y0)}" width="{_n(max(b - a, 0.5))}" height="{_n(h)}" '
                   f'fill="{m.color}" fill-opacity="{_n(m.alpha)}"/>')
    elif m.kind == "point":
        px, py = fx(m.x), fy(m.y)
        if m.low is not None and m.high is not None:
            a, b = fx(m.low), fx(m.high)
            out.append(f'<path d="M {_n(a)} {_n(py)} L {_n(b)} {_n(py)} M {_n(a)} {_n(py - 3)} L {_n(a)} {_n(py + 3)} '
                       f'M {_n(b)} {_n(py - 3)} L {_n(b)} {_n(py + 3)}" stroke="{m.color}" stroke-width="1.3" '
                       'fill="none"/>')
        out.append(f'<circle cx="{_n(px)}" cy="{_n(py)}" r="3" fill="{m.color}"/>')
        if m.ring:
            out.append(f'<circle cx="{_n(px)}" cy="{_n(py)}" r="7" fill="none" stroke="{INK}" stroke-width="1"/>')
    elif m.kind == "text":
        px, py = fx(m.x) + m.dx, fy(m.y) - m.dy
        out.append(f'<text x="{_n(px)}" y="{_n(py)}" font-size="{_n(m.size)}" fill="{m.color}">{_esc(m.text)}</text>')


def _draw_vlabel(out: list[str], m: Mark, px: float, y0: float, h: float) -> None:
    length = min(text_width(m.text, m.size), h * 0.96)
    top = y0 + h * 0.02
    x = px - 1.5  # the text's baseline, just left of the line; the glyphs rise to its left
    out.append(f'<rect x="{_n(x - m.size * 1.05)}" y="{_n(top)}" width="{_n(m.size * 1.15)}" '
               f'height="{_n(length + 2)}" fill="white" fill-opacity="0.8"/>')
    out.append(f'<text transform="translate({_n(x - m.size * 0.2)},{_n(top + 1)}) rotate(-90)" text-anchor="end" '
               f'font-size="{_n(m.size)}" fill="{m.color}">{_esc(m.text)}</text>')


# --- legends --------------------------------------------------------------------------------------

_SAMPLE = 18.0  # a legend sample's width
_ROW = SMALL * 1.6


def legend_width(entries: Sequence[Entry]) -> float:
    return _SAMPLE + 6 + max((text_width(e.label, SMALL) for e in entries), default=0.0)


def _sample(e: Entry, x: float, y: float) -> str:
    if e.kind == "line":
        dash = f' stroke-dasharray="{DASHES[e.dash]}"' if e.dash in DASHES else ""
        return f'<path d="M {_n(x)} {_n(y)} L {_n(x + _SAMPLE)} {_n(y)}" stroke="{e.color}" stroke-width="1.3"{dash}/>'
    if e.kind == "patch":
        return (f'<rect x="{_n(x)}" y="{_n(y - 4)}" width="{_n(_SAMPLE)}" height="7" fill="{e.color}" '
                f'fill-opacity="{_n(e.alpha)}"/>')
    if e.kind == "ring":
        return f'<circle cx="{_n(x + _SAMPLE / 2)}" cy="{_n(y)}" r="5" fill="none" stroke="{INK}" stroke-width="1"/>'
    return f'<circle cx="{_n(x + _SAMPLE / 2)}" cy="{_n(y)}" r="3" fill="{e.color}"/>'


def draw_legend(out: list[str], index: int, entries: Sequence[Entry], x: float, y: float, *, columns: int) -> None:
    """Entries in rows of ``columns``, from (x, y) at the top left."""
    out.append(f'<g id="legend_{index}">')
    col = legend_width(entries) + 10
    for k, e in enumerate(entries):
        cx, cy = x + (k % columns) * col, y + (k // columns) * _ROW + _ROW / 2
        out.append(_sample(e, cx, cy) + f'<text x="{_n(cx + _SAMPLE + 6)}" y="{_n(cy)}" dy="0.35em" '
                   f'font-size="{_n(SMALL)}">{_esc(e.label)}</text>')
    out.append("</g>")


# --- figures --------------------------------------------------------------------------------------


@dataclass
class Figure:
    """Axes in a grid of ``rows`` x ``cols``, ``width`` x ``height`` points; ``legend_below``: one
    legend for the whole figure, centred under the grid, of every axes' entries."""

    width: float
    height: float
    rows: int = 1
    cols: int = 1
    axes: list[Axes] = field(default_factory=list)
    legend_below: bool = False

    def __post_init__(self) -> None:
        if not self.axes:
            self.axes = [Axes() for _ in range(self.rows * self.cols)]

    def svg(self) -> str:
        shown = [a for a in self.axes if a.visible]
        below: list[Entry] = []
        if self.legend_below:
            seen: set[str] = set()
            for a in shown:
                for e in a.entries():
                    if e.label not in seen:
                        seen.add(e.label)
                        below.append(e)
        columns = min(len(below), 7) or 1
        legend_h = (math.ceil(len(below) / columns) * _ROW + 8) if below else 0.0
        cell_w, cell_h = self.width / self.cols, (self.height - legend_h - 8) / self.rows
        needs = [a.needs(cell_h - 40) for a in self.axes]
        left = [max(needs[r * self.cols + c][0] for r in range(self.rows)) for c in range(self.cols)]
        right = [max(needs[r * self.cols + c][1] for r in range(self.rows)) for c in range(self.cols)]
        top = [max(needs[r * self.cols + c][2] for c in range(self.cols)) for r in range(self.rows)]
        bottom = [max(needs[r * self.cols + c][3] for c in range(self.cols)) for r in range(self.rows)]
        body: list[str] = []
        for i, a in enumerate(self.axes):
            if not a.visible:
                continue
            r, c = divmod(i, self.cols)
            x0, y0 = c * cell_w + left[c] + 4, 4 + r * cell_h + top[r]
            w = max(cell_w - left[c] - right[c] - 4, 20.0)
            h = max(cell_h - top[r] - bottom[r], 20.0)
            body.append(f'<clipPath id="@CLIP@-{i}"><rect x="{_n(x0)}" y="{_n(y0)}" width="{_n(w)}" '
                        f'height="{_n(h)}"/></clipPath>')
            a.draw(body, i + 1, (x0, y0, w, h), f"@CLIP@-{i}")
        if below:
            lw = (legend_width(below) + 10) * columns
            draw_legend(body, 0, below, max((self.width - lw) / 2, 4.0), self.height - legend_h, columns=columns)
        text = "".join(body)
        tag = f"c{zlib.crc32(text.encode()):08x}"  # unique on a page of several figures, same for the same one
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(self.width)}pt" height="{_n(self.height)}pt" '
                f'viewBox="0 0 {_n(self.width)} {_n(self.height)}" font-family="{FAMILY}" font-size="{_n(FONT)}" '
                f'fill="{INK}" role="img"><rect width="100%" height="100%" fill="white"/>'
                + text.replace("@CLIP@", tag) + "</svg>")


__all__ = ["Axes", "Entry", "Figure", "Mark", "Scale", "plain", "text_width"]
