"""The optional task check: a user's scorer of outputs (higher is better), run on each side's answers.

Records handed to the scorer, one per prompt, in probe order::

    {"id": "...", "messages": [{"role": "user", "content": "..."}], "output": "the greedy answer"}

``[task] command``: the records as JSON Lines on stdin; stdout holds one score per record, either a
bare number per line or ``{"id": ..., "score": ...}`` objects (matched by id). ``[task] function``:
``"module:function"`` imported and called with the list of records, returning a list of numbers in
the same order. Both run with a timeout; a scorer that fails raises :class:`ConfigError` naming it.

This module runs only the user's scorer; it never talks to a server.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
from collections.abc import Sequence
from typing import Any

from harvest.errors import ConfigError
from harvest.quality.settings import TaskSettings


def _fail(settings: TaskSettings, reason: str) -> ConfigError:
    what = " ".join(settings.command) if settings.command else str(settings.function)
    return ConfigError("task check", [(f"[task] {what}", reason)])


def _number(value: Any) -> float:
    number = float(value)
    if math.isnan(number):
        raise ValueError("NaN")
    return number


def run_task(settings: TaskSettings, records: Sequence[dict[str, Any]]) -> list[float]:
    """Scores of ``records`` by the configured scorer, in the records' order."""
    if not settings.enabled:
        raise ValueError("no task check is configured")
    if not records:
        return []
    if settings.function is not None:
        return _call_function(settings, records)
    return _run_command(settings, records)


def _call_function(settings: TaskSettings, records: Sequence[dict[str, Any]]) -> list[float]:
    module_name, _, attr = str(settings.function).partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise _fail(settings, f"cannot import: {exc}") from None
    try:
        scores = [_number(s) for s in fn([dict(r) for r in records])]
    except Exception as exc:  # the user's code: any failure is reported as the scorer's
        raise _fail(settings, f"the function failed: {type(exc).__name__}: {exc}") from None
    if len(scores) != len(records):
        raise _fail(settings, f"returned {len(scores)} scores for {len(records)} records")
    return scores


def _run_command(settings: TaskSettings, records: Sequence[dict[str, Any]]) -> list[float]:
    stdin = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    try:
        proc = subprocess.run(settings.command, input=stdin, capture_output=True, text=True,
                              timeout=settings.timeout)
    except subprocess.TimeoutExpired:
        raise _fail(settings, f"no answer within {settings.timeout:g} s") from None
    except OSError as exc:
        raise _fail(settings, f"cannot run: {exc}") from None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise _fail(settings, f"exit code {proc.returncode}: {tail}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        parsed = [json.loads(line) for line in lines]
        if parsed and all(isinstance(p, dict) for p in parsed):
            by_id = {str(p["id"]): _number(p["score"]) for p in parsed}
            return [by_id[str(r["id"])] for r in records]
        scores = [_number(p) for p in parsed]
    except (ValueError, KeyError, TypeError) as exc:
        raise _fail(settings, f"unreadable scores on stdout: {exc}") from None
    if len(scores) != len(records):
        raise _fail(settings, f"wrote {len(scores)} scores for {len(records)} records")
    return scores


__all__ = ["run_task"]
