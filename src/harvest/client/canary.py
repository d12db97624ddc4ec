"""The canary: one small streamed request kept going to an endpoint whose engine has no /metrics.

Without queue gauges (``transformers serve``, an OpenAI-compatible endpoint of unknown make) the only
other signal of a concurrency level is its answers, one answer latency after the level was set:
7-20 s on an H200 at a big batch. A canary shows it in seconds. Its first token says whether the
engine admitted it at once or queued it behind what it cannot run yet; the pace of its later tokens
is the engine's decode step as a request in the batch sees it, so ``requests held / step`` is the
engine's tok/s at that level (:meth:`~harvest.client.autoconc.AutoConcurrency.step`).

One canary at a time per endpoint, sent right after the previous one ended while the controller
wants a reading (none while it rests: :meth:`~harvest.client.autoconc.AutoConcurrency.canary_rests`;
on the H200 one streamed back to back cost transformers serve a third of its tok/s): ``max_tokens``
tokens of a fixed prompt, streamed. It is not an item: it is never retried, never counted in the
client's statistics or errors, and never makes an endpoint sick. An endpoint that answers it ``give_up_after``
times in a row with an error status or without streaming is steered on its answers alone; a canary
lost to a connection failure is only a lost reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from harvest.client.autoconc import Canary
from harvest.transport import TimedEvents, TransportError

log = logging.getLogger("harvest.client")

#: ``send(endpoint_url, arrivals)``: stream one canary request to the endpoint, appending each
#: event's arrival (seconds since sending) to ``arrivals`` as it comes.
#: A coroutine function: the runner makes a task of each canary.
Send = Callable[[str, list[float]], Coroutine[Any, Any, TimedEvents]]

#: Tokens per canary: enough gaps for a decode step's pace, few enough to end in seconds.
TOKENS = 10

#: The smallest target a canary is kept at: below 32 it is more than 3 % of what the engine is
#: sent, or of the places the items have (a quarter of a 4-slot engine); there the engine is
#: steered on its answers, which at such small batches come back soon.
MIN_TARGET = 32

PROMPT = "Count from 1 to 200 in words, one number per line."


def canary_body(model: str | None, max_tokens: int, *, chat: bool = True) -> bytes:
    """The canary's request: a chat, or a plain completion for a client that sends those (a base
    model may have no chat template)."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT + "\n"
    if model:
        body["model"] = model
    return json.dumps(body).encode()


class CanaryRunner:
    """The canary of one endpoint: start it, read it at every control step."""

    def __init__(self, send: Send, *, give_up_after: int = 3):
        self._send = send
        self._give_up_after = give_up_after
        self._task: asyncio.Task[TimedEvents] | None = None
        self._arrivals: list[float] = []
        self._sent: tuple[float, int] = (0.0, 0)
        self._failures = 0

    @property
    def given_up(self) -> bool:
        return self._failures >= self._give_up_after

    @property
    def going(self) -> bool:
        return self._task is not None and not self._task.done()

    def poll(self, url: str, now: float) -> Canary | None:
        """The canary as it stands at clock time ``now``: the one going, the one that just finished
        (read once), or None (none, or it failed)."""
        task = self._task
        if task is None:
            return None
        sent_at, held = self._sent
        if not task.done():
            first = self._arrivals[0] if self._arrivals else None
            return Canary(sent_at, held, now - sent_at, ttft=first)
        self._task = None
        return self._finished(task, url)

    def start(self, url: str, now: float, outstanding: int) -> None:
        """Send the next canary (``outstanding``: the client's requests on the endpoint now)."""
        if self.going or self.given_up:
            return
        self._arrivals = []
        self._sent = (now, outstanding)
        self._task = asyncio.get_running_loop().create_task(self._send(url, self._arrivals))
        # Read at the next step, or never (the client closed first, after a hung run): its failure
        # is retrieved here so that asyncio has nothing to report at exit.
        self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _finished(self, task: asyncio.Task[TimedEvents], url: str) -> Canary | None:
        sent_at, held = self._sent
        try:
            events = task.result()
        except (TransportError, asyncio.CancelledError):
            return None  # a lost reading (the server down or restarting), not a verdict on streaming
        except Exception as exc:  # a transport that cannot stream at all: counted, never raised
            self._failed(url, f"{type(exc).__name__}: {exc}")
            return None
        arrivals = events.arrivals
        if events.status != 200 or len(arrivals) < 4:
            self._failed(url, f"HTTP {events.status}, {len(arrivals)} streamed events")
            return None
        self._failures = 0
        # Mean, not median, of the gaps: events read in one go arrive at the same instant.
        itl = (arrivals[-1] - arrivals[1]) / (len(arrivals) - 2)
        return Canary(sent_at, held, arrivals[-1], ttft=arrivals[0], itl=itl, done=True)

    def _failed(self, url: str, why: str) -> None:
        self._failures += 1
        if self.given_up:
            log.info("auto concurrency: %s does not stream a canary (%s); steering on its answers", url, why)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5.0)


__all__ = ["MIN_TARGET", "PROMPT", "TOKENS", "CanaryRunner", "Send", "canary_body"]
