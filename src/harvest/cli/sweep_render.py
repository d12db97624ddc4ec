"""What ``harvest compare`` and ``harvest tune`` print alike: verdict colours, quality cells, settings.

    table.add_column(*QUALITY_COLUMNS)            # the quality metrics' headers, in this order
    table.add_row(settings_text(row.settings), *quality_cells(row.quality),
                  Text(row.verdict, style=VERDICT_STYLE.get(row.verdict, "")))

Each command's own table (rows of a comparison, trials of a sweep) lives with the command; this
module only formats the values they share. It renders only: nothing here reads folders or runs work.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console

from harvest.cli.render import make_console
from harvest.quality.evaluate import QualityReport
from harvest.quality.metrics import Estimate

#: The colour of each verdict a compare row or a tune trial can have.
VERDICT_STYLE = {"pass": "green", "fail": "bold red", "rejected": "yellow", "failed": "bold red",
                 "skipped": "dim", "not run": "dim",
                 "unsupported": "yellow"}

#: The headers of :func:`quality_cells`, in its order.
QUALITY_COLUMNS = ("top-1 agree", "KL", "|dlogp|", "p99 |dlogp|", "exact", "1st div", "task")


def fmt(e: Estimate | None, digits: int = 3) -> str:
    """``0.981 [0.97, 0.99]``, or ``-`` when not measured."""
    if e is None or e.value is None or math.isnan(e.value):
        return "-"
    return f"{e.value:.{digits}g} [{e.low:.{digits}g}, {e.high:.{digits}g}]"


def quality_cells(q: QualityReport | None) -> list[str]:
    """The quality metrics of a report with their intervals (``-`` each when there is none)."""
    m = q.metrics() if q is not None else {}
    return [fmt(m.get("top1_agreement")), fmt(m.get("mean_kl")), fmt(m.get("mean_abs_delta_logprob")),
            fmt(m.get("p99_abs_delta_logprob")), fmt(m.get("exact_match")),
            fmt(m.get("mean_first_divergence")),
            fmt(m.get("task_score"))]


def settings_text(settings: dict[str, Any]) -> str:
    """``max_num_seqs=8, extra_args=--a b``, or ``-`` when there are no settings."""
    return ", ".join(f"{k}={' '.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in settings.items()) or "-"


def wide_console() -> Console:
    """stdout console; when it is not a terminal, wide enough that table cells are not folded."""
    console = make_console()
    if not console.is_terminal:
        console.width = max(console.width, 240)
    return console


__all__ = ["QUALITY_COLUMNS", "VERDICT_STYLE", "fmt", "quality_cells", "settings_text", "wide_console"]
