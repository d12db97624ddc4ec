"""The suite's time as a budget: ``HARVEST_TIME_BUDGET=<seconds>`` (``make test-fast`` and
``make test`` set it, tests/README.md "The suite's time") bounds the pytest session's own time,
collection included, as pytest measures it for its "passed in" line.

Over the budget, the run says so in one line naming the budget and how far over it went. With
``CI=true`` (the CI machine, ``.ci/run``) that line fails the run (exit 1); elsewhere (a shared or
busy development machine) it is a warning. A run that failed otherwise keeps its own failure, and
a narrowed run (``-k``, a file) is only shorter, never failed by it.
"""

from __future__ import annotations

import os
import time

ENV = "HARVEST_TIME_BUDGET"


def budget_s() -> float | None:
    """The budget in seconds from the environment; None when unset or empty. A value that is not a
    positive number is a usage error naming the variable."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{ENV}={raw!r}: give the budget in seconds, a number above 0")
    return value


def verdict(elapsed_s: float, budget: float, *, ci: bool) -> tuple[bool, str] | None:
    """(fails the run, the line to print) when ``elapsed_s`` is over ``budget``; None within it."""
    if elapsed_s <= budget:
        return None
    over = elapsed_s - budget
    where = "failing the run (CI)" if ci else "on CI this fails the run"
    return ci, (f"time budget exceeded: the session took {elapsed_s:.1f} s, {over:.1f} s over its budget of "
                f"{budget:g} s ({ENV}); {where}. The slowest tests: --durations=30; per file: "
                "tests/README.md \"The suite's time\"")


class Clock:
    """The session's start, read when pytest starts the session (the start of its own clock)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start
