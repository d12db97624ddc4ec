"""Why rows were skipped, and what fixes them: the reasons grouped with their counts and a hint.

    reasons = [SkipReason("shape", "no 'prompt', ... field (the row has 'qid', 'question')", 20)]
    describe_skips(reasons)     # lines for the console, ``harvest status`` and the report
    shape_settings(data)        # the [data] settings that decide whether a row fits

A skipped row keeps its error class (its ``Skipped.kind``, or the runner's class for an item
skipped later, e.g. ``context_length``); the hint is chosen by that class, never by the text. The
rows of class ``shape`` are read again from the source when :func:`shape_settings` change (and by
``harvest run --retry skipped``). This module only formats; it never reads files or the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harvest.config import DataConfig

#: A run with more than this share of its unique input rows skipped ends non-zero (the rows are
#: kept; fix ``[data]`` and run again, or raise ``[data] max_skipped_share``).
DEFAULT_MAX_SKIPPED_SHARE = 0.5

_HINTS = {
    "shape": "the rows do not fit [data]: set prompt_field (or messages_field / conversations_field, or "
             "shape) to the field that holds the prompt, then run again (skipped rows are read again)",
    "input": "the rows cannot be read as they are in the file: fix them at the lines listed by "
             "`harvest status --json` (skipped_reasons), then `harvest run --retry skipped`",
    "context_length": "the prompts cannot fit the model's context with max_tokens: lower [sampling] "
                      "max_tokens, raise [data] max_prompt_tokens or serve a longer context, then "
                      "`harvest run --retry skipped`",
}


@dataclass(frozen=True)
class SkipReason:
    """Skipped rows that share an error class and a reason (:func:`reason_key`), with an example
    of where one is."""

    error_class: str
    reason: str
    count: int
    #: One such row: its file and line (the first in input order), when known.
    source: str | None = None
    line: int | None = None

    @property
    def hint(self) -> str:
        return skip_hint(self.error_class)

    def to_dict(self) -> dict[str, Any]:
        return {"error_class": self.error_class, "reason": self.reason, "count": self.count,
                "example": None if self.source is None else {"source": self.source, "line": self.line},
                "hint": self.hint}


def reason_key(reason: str) -> str:
    """The part of a skip reason that rows share: without a trailing ``(...)`` that places the
    fault inside the row (``bad JSON: Expecting value (line 23, column 27)`` -> ``bad JSON:
    Expecting value``); the row's own line is kept with the row. Same as :data:`REASON_KEY_SQL`."""
    cut = reason.find(" (")
    return reason[:cut] if cut > 0 else reason


#: :func:`reason_key` in SQLite, over the column ``last_error``.
REASON_KEY_SQL = ("CASE WHEN instr(last_error, ' (') > 1 THEN substr(last_error, 1, instr(last_error, ' (') - 1)"
                  " ELSE COALESCE(last_error, '?') END")


def skip_hint(error_class: str | None) -> str:
    """What fixes rows skipped with ``error_class``."""
    return _HINTS.get(error_class or "input", _HINTS["input"])


def shape_settings(data: DataConfig) -> dict[str, Any]:
    """The ``[data]`` settings that decide whether a row fits (and so which rows are skipped)."""
    return {"format": data.format, "shape": data.shape, "id_field": data.id_field,
            "prompt_field": data.prompt_field, "messages_field": data.messages_field,
            "conversations_field": data.conversations_field}


def describe_skips(reasons: Sequence[SkipReason], *, limit: int = 5) -> list[str]:
    """One line per reason (most frequent first), then one hint per error class present."""
    lines = []
    for r in list(reasons)[:limit]:
        where = f" (e.g. {_name(r.source)}:{r.line})" if r.source is not None and r.line is not None else ""
        lines.append(f"skipped {r.count:,}: {r.reason}{where}")
    if len(reasons) > limit:
        lines.append(f"skipped {sum(r.count for r in list(reasons)[limit:]):,} more for "
                     f"{len(reasons) - limit} other reasons")
    seen: list[str] = []
    for r in reasons:
        if r.error_class not in seen:
            seen.append(r.error_class)
            lines.append(f"  fix: {r.hint}")
    return lines


def _name(source: str) -> str:
    from pathlib import PurePath

    return PurePath(source).name


__all__ = ["DEFAULT_MAX_SKIPPED_SHARE", "REASON_KEY_SQL", "SkipReason", "describe_skips", "reason_key", "shape_settings",
           "skip_hint"]
