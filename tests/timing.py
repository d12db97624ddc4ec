"""Slack for timing checks in tests: what a loaded 2-core machine (five engineers' tests, engines and
builds at once) adds to a bounded wait through scheduling, interpreter pauses and a busy disk.

A timing check is a bound with this margin, never ~0.1 s: the promise tested is that the wait ends
near its own budget instead of at the next, much larger one (a grace period, a command timeout).
Speed targets are ratios in bench/ (BENCHMARKS.md), not assertions here.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from tests import harvest_process

#: Seconds a bounded wait may overrun its budget on a loaded 2-core machine.
SLACK_S = 2.0
#: Seconds between two measures of the start-up while a timed command runs.
SAMPLE_EVERY_S = 0.5


def cli_startup_s(cwd: str | None = None) -> float:
    """Seconds a ``harvest`` command takes here, now, when it has nothing to do: its start and the
    answer (``harvest stop`` of a folder with no record, refused at once), started as the command
    under test is (tests/harvest_process.py: forked, or a fresh interpreter where the fork does not
    apply). A bound on a whole CLI command is its own budget plus this, measured right before: the
    start-up under the machine's load of the moment, not a fixed guess (5 s failed at load 48)."""
    t = time.monotonic()
    harvest_process.run([sys.executable, "-m", "harvest", "stop", "/nonexistent-harvest-run", "--json"],
                        capture_output=True, text=True, timeout=300, cwd=cwd)
    return time.monotonic() - t


def run_cli_timed(argv: Sequence[str], timeout: float) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run a ``harvest`` command; its result, its seconds and the start-up its bound allows for.

    The start-up is the slowest :func:`cli_startup_s` measured right before the command and, one
    after another, all the while it runs: the load of the command's own moments, not of the one
    before it. Five test workers on two cores swing from idle to a vLLM start within seconds: a
    start-up of 1.9 s measured just before was followed by a command that took 9 s more than its
    own stop. One measure every :data:`SAMPLE_EVERY_S` while the command runs (back to back they
    kept a core busy of their own)."""
    before = cli_startup_s()
    during: list[float] = []
    done = threading.Event()

    def measure() -> None:
        while not done.wait(SAMPLE_EVERY_S):
            during.append(cli_startup_s())

    sampler = threading.Thread(target=measure, daemon=True)
    t = time.monotonic()
    sampler.start()
    try:
        out = harvest_process.run(list(argv), capture_output=True, text=True, timeout=timeout)
    finally:
        took = time.monotonic() - t
        done.set()
        sampler.join(timeout)
    return out, took, max([before, *during])


__all__ = ["SLACK_S", "cli_startup_s", "run_cli_timed"]
