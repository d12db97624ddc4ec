"""The hang check's probes side by side, and its line saying what was seen, with the seconds of
nothing back when it was seen (harvest.client.hang).

An engine frozen whole (SIGSTOP, a paused container) answers nothing, ``/metrics`` and ``/health``
included; one that comes back a little later answers them again. Read one after the other, a
``/metrics`` that timed out while frozen would be followed by a ``/health`` that answered after the
thaw, and the line said "hung ... while /health answered", stale by a probe's timeout, although
``/health`` never answered while it was frozen. Read side by side, both see the frozen engine.
Real time at a shortened scale (floor 0.4 s, probe timeout 1 s); the engine is the client's
MockTransport, frozen and thawed by the test.
"""

from __future__ import annotations

import asyncio
import time

from harvest.client import Client, EndpointState, RawResponse, RetryPolicy
from harvest.client.hang import hung_line
from harvest.config import ClientConfig, SamplingConfig
from harvest.transport import MockTransport
from tests.client.fakes import FakeServer, chat_response

A = "http://a.test:8000"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello"}]
FLOOR, PROBE = 0.4, 1.0


class Frozen:
    """Every answer of the engine waits while it is frozen; it thaws at ``thaw_at`` (monotonic)."""

    def __init__(self) -> None:
        self.thaw_at = float("inf")
        self.health_seen: list[tuple[float, bool]] = []

    async def wait(self) -> None:
        while time.monotonic() < self.thaw_at:
            await asyncio.sleep(0.01)


async def test_a_frozen_engine_that_comes_back_is_said_not_to_answer_health_never_hung():
    server, engine = FakeServer(), Frozen()

    async def chat(base: str) -> RawResponse:
        await engine.wait()
        return chat_response(base)

    async def health(base: str) -> RawResponse:
        await engine.wait()
        return RawResponse(200, b"")

    async def metrics(base: str) -> RawResponse:
        await engine.wait()
        return RawResponse(200, b"llamacpp:tokens_predicted_total 7\n")

    server.routes[("POST", CHAT)] = chat
    server.routes[("GET", "/health")] = health
    server.routes[("GET", "/metrics")] = metrics
    config = ClientConfig(concurrency=4, max_retries=0, health_deadline=60, request_timeout=3600)
    retry = RetryPolicy(hang_floor=FLOOR, hang_interval=0.05, health_interval=0.05, probe_timeout=PROBE)
    states: list[EndpointState] = []
    async with Client([A], config, SamplingConfig(max_tokens=8), model="m", transport=MockTransport(server.handler),
                      retry=retry) as client:
        engine.thaw_at = time.monotonic() + 1e9
        frozen_at = time.monotonic()
        held = [asyncio.create_task(client.chat(MSG)) for _ in range(2)]
        # The first reading of the token counter begins at half the bound and times out one probe
        # later; the verdict's probes begin at the next look. Thawed half a probe after they timed
        # out: one after the other, /health would have been asked then, and answered.
        engine.thaw_at = frozen_at + FLOOR / 2 + PROBE + 0.05 + 1.5 * PROBE
        while not all(t.done() for t in held):
            states.append(client.stats().endpoints[0].state)
            await asyncio.sleep(0.01)
        last = client.stats().endpoints[0]
    assert EndpointState.HUNG not in states, "said hung (/health answering) of an engine frozen whole"
    assert EndpointState.SICK in states
    assert last.state is EndpointState.HEALTHY  # it came back: back in rotation
    assert all(t.result().attempts == 1 for t in held)


def test_the_lines_say_what_was_seen():
    assert hung_line(152.4) == "hung: no answer for 152 s while /health answered"
    assert hung_line(45.2, False) == "not answering: no answer for 45 s and /health did not answer"
