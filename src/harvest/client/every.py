"""One background task that runs a step at a fixed interval for as long as the client lives.

    loop = Every(step, interval_s=2.0, sleep=asyncio.sleep, failed="hang check failed")
    loop.ensure_started()     # from inside the event loop; a no-op while it runs
    await loop.aclose()       # cancelled, waited for at most 5 s

A step that raises is logged and the next one runs at its time: what runs beside the requests (the
hang watchdog, the concurrency steering) never ends the client. Cancellation goes through.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("harvest.client")

#: How long :meth:`Every.aclose` waits for the cancelled task to end.
CLOSE_WAIT_S = 5.0


class Every:
    """``step()`` every ``interval_s`` seconds (slept with ``sleep`` first), in one task."""

    def __init__(self, step: Callable[[], Awaitable[object]], *, interval_s: float,
                 sleep: Callable[[float], Awaitable[object]], failed: str):
        self._step = step
        self.interval_s = interval_s
        self._sleep = sleep
        #: The log line's start when a step raises.
        self._failed = failed
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        """Start the task (from inside the event loop); a no-op while it runs."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        """Cancel the task and wait for it, at most :data:`CLOSE_WAIT_S`."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=CLOSE_WAIT_S)

    async def _run(self) -> None:
        while True:
            await self._sleep(self.interval_s)
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad step must not end what runs beside the requests
                log.exception("%s; the next step runs in %g s", self._failed, self.interval_s)


__all__ = ["CLOSE_WAIT_S", "Every"]
