"""The suite's time as a budget: ``HARVEST_TIME_BUDGET=<seconds>`` (``make test-fast`` and
``make test`` set it, tests/README.md "The suite's time") bounds the pytest session's own time,
collection included, as pytest measures it for its "passed in" line.

Over the budget, the run says so in one line naming the budget and how far over it went. With
``CI=true`` (the CI machine, ``.ci/run``) that line fails the run (exit 1); elsewhere (a shared or
busy development machine) it is a warning. A run that failed otherwise keeps its own failure, and
a narrowed run (``-k``, a file) is only shorter, never failed by it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

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


# --- where the time went: per test, per file ----------------------------------------------------------

#: ``HARVEST_TEST_TIMES=<path>``: the session writes every test's time there (JSON), for
#: ``scripts/test-times`` (the per-file table of tests/README.md).
TIMES_ENV = "HARVEST_TEST_TIMES"


class Times:
    """Each test's seconds (set-up, call and tear-down together), its pytest-xdist worker and group,
    as the controller receives the reports."""

    def __init__(self) -> None:
        self.tests: dict[str, dict[str, Any]] = {}

    def add(self, nodeid: str, seconds: float, worker: str, group: str) -> None:
        row = self.tests.setdefault(nodeid, {"seconds": 0.0, "worker": worker, "group": group})
        row["seconds"] = round(row["seconds"] + seconds, 3)

    def write(self, path: str, session_s: float) -> None:
        workers = len({row["worker"] for row in self.tests.values()})
        doc = {"session_s": round(session_s, 3), "workers": workers, "tests": self.tests}
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=0, sort_keys=True)


def file_table(doc: dict[str, Any], *, at_least_s: float = 10.0) -> str:
    """Markdown: each test file's seconds (its tests' set-up, call and tear-down, summed), its share
    of all tests' seconds, its tests and its xdist group(s); files under ``at_least_s`` together in
    one row; then the session's time and each one-worker group's chain."""
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    groups_of: dict[str, set[str]] = {}
    chains: dict[str, float] = {}
    for nodeid, row in doc["tests"].items():
        name = nodeid.split("::", 1)[0]
        seconds[name] = seconds.get(name, 0.0) + row["seconds"]
        counts[name] = counts.get(name, 0) + 1
        shared = row["group"] in SHARED_GROUPS
        groups_of.setdefault(name, set()).add(f"`{row['group']}`" if shared else "its module")
        if shared:
            chains[row["group"]] = chains.get(row["group"], 0.0) + row["seconds"]
    total = sum(seconds.values())
    lines = ["| file | seconds | share | tests | xdist group |", "|---|---|---|---|---|"]
    rest_s, rest_tests, rest_files = 0.0, 0, 0
    for name in sorted(seconds, key=lambda n: -seconds[n]):
        if seconds[name] < at_least_s:
            rest_s, rest_tests, rest_files = rest_s + seconds[name], rest_tests + counts[name], rest_files + 1
            continue
        lines.append(f"| `{name}` | {seconds[name]:.0f} | {100 * seconds[name] / total:.1f} % | {counts[name]} | "
                     f"{', '.join(sorted(groups_of[name]))} |")
    if rest_files:
        lines.append(f"| the other {rest_files} files (each under {at_least_s:g} s) | {rest_s:.0f} | "
                     f"{100 * rest_s / total:.1f} % | {rest_tests} | |")
    lines.append(f"| **all** | {total:.0f} | 100 % | {len(doc['tests'])} | |")
    chain = ", ".join(f"`{g}` {chains[g]:.0f} s" for g in SHARED_GROUPS if g in chains)
    lines += ["", f"The session: {doc['session_s']:.0f} s on {doc['workers']} workers ({total:.0f} s of tests in "
                  "all)" + (f"; the one-worker groups: {chain}." if chain else ".")]
    return "\n".join(lines)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a pytest run a test starts: this session's budget and time record are
    not the child's (it would fail on them, or write over the record)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, TIMES_ENV)}
    env.update(extra)
    return env


#: The xdist groups that run on one worker, one test after another (tests/conftest.py).
SHARED_GROUPS = ("vllm", "ray", "transformers")
