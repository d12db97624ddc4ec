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


def per_file(doc: dict[str, Any]) -> tuple[dict[str, float], dict[str, int], dict[str, set[str]], dict[str, float]]:
    """From a record: each file's seconds, its tests, its xdist groups; each one-worker group's chain."""
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
    return seconds, counts, groups_of, chains


def file_table(doc: dict[str, Any], *, at_least_s: float = 10.0, before: dict[str, Any] | None = None) -> str:
    """Markdown: each test file's seconds (its tests' set-up, call and tear-down, summed), its share
    of all tests' seconds, its tests and its xdist group(s), and with ``before`` (an earlier record)
    that record's seconds and tests beside them; files under ``at_least_s`` in both together in one
    row; then the session's time and each one-worker group's chain."""
    seconds, counts, groups_of, chains = per_file(doc)
    old_s, old_n, _, old_chains = per_file(before) if before is not None else ({}, {}, {}, {})
    total = sum(seconds.values())
    then = " | before: seconds | before: tests" if before is not None else ""
    lines = [f"| file | seconds | share | tests{then} | xdist group |",
             "|---|---|---|---" + ("|---|---" if before is not None else "") + "|---|"]
    rest = [0.0, 0, 0, 0.0, 0]
    for name in sorted(set(seconds) | set(old_s), key=lambda n: -max(seconds.get(n, 0.0), old_s.get(n, 0.0))):
        now, was = seconds.get(name, 0.0), old_s.get(name, 0.0)
        if max(now, was) < at_least_s:
            rest = [rest[0] + now, rest[1] + counts.get(name, 0), rest[2] + 1, rest[3] + was, rest[4] + old_n.get(name, 0)]
            continue
        share = f"{100 * now / total:.1f} %" if total else "-"
        old = f" | {was:.0f} | {old_n.get(name, 0)}" if before is not None else ""
        lines.append(f"| `{name}` | {now:.0f} | {share} | {counts.get(name, 0)}{old} | "
                     f"{', '.join(sorted(groups_of.get(name, {'-'})))} |")
    if rest[2]:
        old = f" | {rest[3]:.0f} | {rest[4]}" if before is not None else ""
        lines.append(f"| the other {rest[2]} files (each under {at_least_s:g} s) | {rest[0]:.0f} | "
                     f"{100 * rest[0] / total:.1f} % | {rest[1]}{old} | |")
    old = f" | {sum(old_s.values()):.0f} | {len(before['tests'])}" if before is not None else ""
    lines.append(f"| **all** | {total:.0f} | 100 % | {len(doc['tests'])}{old} | |")
    now = _session_line(doc, chains)
    lines += ["", f"Now {now} Before, {_session_line(before, old_chains)}" if before is not None
              else now[0].upper() + now[1:]]
    return "\n".join(lines)


def _session_line(doc: dict[str, Any], chains: dict[str, float]) -> str:
    total = sum(row["seconds"] for row in doc["tests"].values())
    chain = ", ".join(f"`{g}` {chains[g]:.0f} s" for g in SHARED_GROUPS if g in chains)
    return (f"the session {doc['session_s']:.0f} s on {doc['workers']} workers ({total:.0f} s of tests in all)"
            + (f"; the one-worker groups: {chain}." if chain else "."))


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a pytest run a test starts: this session's budget and time record are
    not the child's (it would fail on them, or write over the record)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, TIMES_ENV)}
    env.update(extra)
    return env


#: The xdist groups that run on one worker, one test after another (tests/conftest.py).
SHARED_GROUPS = ("vllm", "ray", "transformers")
