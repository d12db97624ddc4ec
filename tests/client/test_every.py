"""``client/every.py``: the loop beside the requests (hang watchdog, steering) outlives a step that
raises, runs again at its interval, and is gone once closed."""

from __future__ import annotations

import asyncio
import logging

from harvest.client.every import Every


async def test_a_step_that_raises_is_logged_and_the_next_one_runs_then_close_ends_the_task(caplog):
    calls: list[int] = []

    async def step() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            raise ValueError("a bad reading")

    loop = Every(step, interval_s=0.01, sleep=asyncio.sleep, failed="check failed")
    with caplog.at_level(logging.ERROR, logger="harvest.client"):
        loop.ensure_started()
        loop.ensure_started()  # a no-op while it runs: one task
        for _ in range(500):
            if len(calls) >= 4:
                break
            await asyncio.sleep(0.01)
        await loop.aclose()
    assert len(calls) >= 4  # went on past the failing second step
    assert [r.getMessage() for r in caplog.records] == ["check failed; the next step runs in 0.01 s"]
    seen = len(calls)
    await asyncio.sleep(0.05)
    assert len(calls) == seen  # closed: no step after it
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
