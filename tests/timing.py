"""Slack for timing checks in tests: what a loaded 2-core machine (five engineers' tests, engines and
builds at once) adds to a bounded wait through scheduling, interpreter pauses and a busy disk.

A timing check is a bound with this margin, never ~0.1 s: the promise tested is that the wait ends
near its own budget instead of at the next, much larger one (a grace period, a command timeout).
Speed targets are ratios in bench/ (BENCHMARKS.md), not assertions here.
"""

from __future__ import annotations

#: Seconds a bounded wait may overrun its budget on a loaded 2-core machine.
SLACK_S = 2.0

__all__ = ["SLACK_S"]
