"""The suite's time as a budget: ``HARVEST_TIME_BUDGET=<seconds>`` (``make test-fast`` and
``make test`` set it, tests/README.md "The suite's time") bounds the pytest session's own time,
collection included, as pytest measures it for its "passed in" line.

Over the budget, the run says so in one line naming the budget and how far over it went. With
``CI=true`` (the CI machine, ``.ci/run``) that line fails the run (exit 1); elsewhere (a shared or
busy development machine) it is a warning. A run that failed otherwise keeps its own failure, and
a narrowed run (``-k``, a file) is only shorter, never failed by it.

``HARVEST_TIME_BUDGET_PROBE_MS=<ms>`` (``make test-fast`` sets it) says the budget was set on a
machine where :func:`speed_probe_ms` measures that many milliseconds: the budget then follows this
machine's speed, measured at the session's end, by the ratio of the two (within
:data:`SCALE_RANGE`). Machines that run the same tier x2.3 apart exist (2-core VMs of two CPU
models, 2026-12-07): one number of seconds is either no check on the fast one or a failure on the
slow one. The probe is the best of many short rounds of this thread's CPU time, so the load of the
moment moves it little; what load adds to a session is the budget's margin.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

ENV = "HARVEST_TIME_BUDGET"
#: Where the budget was set: :func:`speed_probe_ms` there, in milliseconds.
PROBE_ENV = "HARVEST_TIME_BUDGET_PROBE_MS"
#: How far a budget follows the machine: x0.5 on one twice as fast, at most x3 on a slower one.
SCALE_RANGE = (0.5, 3.0)


def _positive(name: str, what: str) -> float | None:
    """The number in environment variable ``name``; None when unset or empty. A value that is not a
    positive number is a usage error naming the variable and ``what`` it gives."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: give {what}, a number above 0")
    return value


def budget_s() -> float | None:
    """The budget in seconds (``HARVEST_TIME_BUDGET``); None when unset."""
    return _positive(ENV, "the budget in seconds")


def probe_ms() -> float | None:
    """The speed probe's milliseconds where the budget was set (``HARVEST_TIME_BUDGET_PROBE_MS``);
    None when unset."""
    return _positive(PROBE_ENV, "the speed probe's milliseconds where the budget was set")


_WORD = re.compile(r"[a-z]+_\d+")


def _probe_round() -> int:
    """One round of the probe: JSON both ways, a regular expression, a sort and a loop, the kinds of
    work the tests' Python does (about 5 ms of CPU on a 2-core AMD EPYC VM)."""
    doc = {f"k{i}": {"id": i, "name": f"item_{i}", "tags": [f"t_{j}" for j in range(8)], "score": i / 7}
           for i in range(400)}
    text = json.dumps(doc)
    back = json.loads(text)
    total = len(_WORD.findall(text))
    rows = sorted((v["score"], k) for k, v in back.items())
    for _ in range(20):
        for score, key in rows:
            total += len(key) + int(score)
    return total


def speed_probe_ms(rounds: int = 60) -> float:
    """This machine's speed: the fewest milliseconds of this thread's CPU time one probe round took,
    of ``rounds`` (CPU time, not wall time: a round that waited for a core is not slower for it;
    the best of many: one that ran beside a busy neighbour is)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        _probe_round()
        best = min(best, time.thread_time() - t)
    return best * 1000


def scaled(budget: float, set_at_ms: float | None, here_ms: float | None) -> float:
    """``budget`` set where the probe took ``set_at_ms``, on a machine where it takes ``here_ms``."""
    if set_at_ms is None or here_ms is None:
        return budget
    low, high = SCALE_RANGE
    return budget * min(high, max(low, here_ms / set_at_ms))


def verdict(elapsed_s: float, budget: float, *, ci: bool, set_at_ms: float | None = None,
            here_ms: float | None = None) -> tuple[bool, str] | None:
    """(fails the run, the line to print) when ``elapsed_s`` is over ``budget`` (scaled to this
    machine's speed where ``set_at_ms`` and ``here_ms`` are given); None within it."""
    limit = scaled(budget, set_at_ms, here_ms)
    if elapsed_s <= limit:
        return None
    over = elapsed_s - limit
    where = "failing the run (CI)" if ci else "on CI this fails the run"
    how = ENV
    if set_at_ms is not None and here_ms is not None:
        how += (f" {budget:g} s where the speed probe takes {set_at_ms:g} ms; here {here_ms:.2f} ms, "
                f"x{limit / budget:.2f}")
    return ci, (f"time budget exceeded: the session took {elapsed_s:.1f} s, {over:.1f} s over its budget of "
                f"{limit:.4g} s ({how}); {where}. The slowest tests: --durations=30; per file: "
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
    env = {k: v for k, v in os.environ.items() if k not in (ENV, PROBE_ENV, TIMES_ENV)}
    env.update(extra)
    return env


#: The xdist groups that run on one worker, one test after another (tests/conftest.py).
SHARED_GROUPS = ("vllm", "ray", "transformers")
