"""The page around the figures: one self-contained HTML file, no script, no outside reference.

Everything the page shows is inline: the style sheet, and each figure as an ``<svg>`` element. The
page runs no JavaScript and names no URL it would load (no CDN, no font, no image file), so it
opens the same offline, from an e-mail attachment or printed. Numbers that ``harvest status --json``
(or tune.json / compare.json) also gives carry ``data-json="<path in that document>"``, so a test
can read them off the rendered page and compare them with the document.

This module formats only; what it shows is decided by the page modules (run, tune, compare).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from harvest.redact import escape_controls

CSS = """
:root { --fg:#1b1f24; --muted:#57606a; --line:#d0d7de; --bg:#ffffff; --accent:#0b5cad; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0 auto; max-width: 1180px; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
.sub { color: var(--muted); margin: 0 0 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 6px 0 12px; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; overflow-wrap: anywhere; }
figure.chart { margin: 10px 0 18px; break-inside: avoid; page-break-inside: avoid; }
figure.chart svg { max-width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 2px; }
.ok { color: #116329; font-weight: 600; } .bad { color: #a40e26; font-weight: 600; }
.warn { color: #9a6700; font-weight: 600; }
tr.best td { background: #dafbe1; } code, pre { font-family: ui-monospace, Menlo, Consolas, monospace;
     font-size: 12px; } pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f8fa;
     padding: 6px; margin: 4px 0; }
.identity { font-size: 16px; margin: 8px 0; }
footer { color: var(--muted); font-size: 12px; margin-top: 32px; }
@media print {
  body { max-width: none; padding: 0; font-size: 10pt; }
  h2 { break-after: avoid; page-break-after: avoid; }
  table, tr { break-inside: avoid; page-break-inside: avoid; }
  tr.best td { background: none; font-weight: 700; }
}
"""


def esc(x: Any) -> str:
    """Text for the page: HTML-escaped, and control characters (ESC, BEL... from a ledger or a
    record another user may have written) shown as visible ``\\x1b``-style escapes."""
    return html.escape(escape_controls("" if x is None else str(x)), quote=True)


def num(x: Any, digits: int = 4) -> str:
    """A number for people: ints with thousands separators, floats to ``digits`` significant
    digits (no exponent below 10^6), ``-`` for None / NaN."""
    if x is None or isinstance(x, bool):
        return "-" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return "-"
        if x == 0:
            return "0"
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"
        decimals = max(digits - 1 - int(math.floor(math.log10(abs(x)))), 0)
        return f"{x:,.{decimals}f}"
    return str(x)


def val(x: Any, path: str | None = None, digits: int = 4) -> str:
    """A number as an inline element; with ``path``, tagged with the document path it shows."""
    attr = f' data-json="{esc(path)}"' if path else ""
    return f"<span{attr}>{esc(num(x, digits))}</span>"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


class Cell:
    """A table cell already rendered as HTML (not escaped again), optionally right-aligned."""

    def __init__(self, html_text: str, numeric: bool = False):
        self.html, self.numeric = html_text, numeric


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, row_classes: Sequence[str] | None = None,
          name: str | None = None) -> str:
    """A table; plain values are escaped, :class:`Cell` values inserted as they are."""
    out = [f'<table{f" data-table={chr(34)}{esc(name)}{chr(34)}" if name else ""}><thead><tr>']
    out += [f"<th>{esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        cls = row_classes[i] if row_classes and i < len(row_classes) and row_classes[i] else ""
        out.append(f'<tr class="{cls}">' if cls else "<tr>")
        for c in row:
            if isinstance(c, Cell):
                out.append(f'<td class="num">{c.html}</td>' if c.numeric else f"<td>{c.html}</td>")
            elif isinstance(c, (int, float)) and not isinstance(c, bool):
                out.append(f'<td class="num">{esc(num(c))}</td>')
            else:
                out.append(f"<td>{esc(c if c is not None else '-')}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def kv(pairs: Iterable[tuple[str, Any]]) -> str:
    """A definition list; values that are :class:`Cell` are inserted as HTML."""
    items = []
    for k, v in pairs:
        shown = v.html if isinstance(v, Cell) else esc("-" if v is None or v == "" else v)
        items.append(f"<dt>{esc(k)}</dt><dd>{shown}</dd>")
    return '<dl class="kv">' + "".join(items) + "</dl>"


def figure(name: str, svg: str, caption: str) -> str:
    """A chart: ``data-chart`` names it (the browser test finds every chart by it)."""
    return (f'<figure class="chart" data-chart="{esc(name)}">{svg}'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def page(title: str, subtitle: str, body: Sequence[str], *, kind: str, version: str) -> str:
    generated = when(datetime.now(timezone.utc).timestamp())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta name=\"generator\" content=\"harvest {esc(version)}\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body data-report=\"{esc(kind)}\"><h1>{esc(title)}</h1><p class=\"sub\">{esc(subtitle)}</p>"
            + "\n".join(escape_controls(b) for b in body)  # and in the figures' SVG text
            + f"<footer>harvest {esc(version)} report, generated {esc(generated)}. Self-contained: "
              "no script, nothing loaded from elsewhere.</footer></body></html>\n")


__all__ = ["CSS", "Cell", "esc", "figure", "kv", "num", "page", "seconds", "table", "val", "when"]
