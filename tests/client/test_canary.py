"""The canary of ``concurrency = "auto"`` on an engine without /metrics, against a real streaming server.

The server is ``bench/sim_engine.py`` with ``--no-metrics`` (the shape of ``transformers serve``: a
batch it runs at once, a first-come-first-served queue behind it, no Prometheus text), run as a
subprocess and stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from harvest.client import Client
from harvest.client.autoconc import AutoSettings
from harvest.client.canary import CanaryRunner, canary_body
from harvest.config import ClientConfig, SamplingConfig
from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import MockTransport, RawResponse, TimedEvents
from tests.engines import sim_engine

BATCH, STEP, OUT = 64, 0.05, 24


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with sim_engine("--token-latency", str(STEP), "--max-batch", str(BATCH), "--no-metrics",
                    "--model", "sim-model") as url:
        yield url


async def test_a_streamed_canary_reports_when_each_token_came(sim: str) -> None:
    transport = AiohttpTransport(max_connections=4)
    arrivals: list[float] = []
    try:
        events = await transport.timed_events(sim + "/v1/chat/completions", body=canary_body("sim-model", 10),
                                              timeout=30, arrivals=arrivals)
    finally:
        await transport.aclose()
    assert events.status == 200 and len(events.arrivals) == 10 and list(events.arrivals) == arrivals
    gaps = [b - a for a, b in zip(events.arrivals, events.arrivals[1:])]
    assert all(g >= 0 for g in gaps)
    # One token per decode step: 9 steps from the first token to the last (a loaded machine is slower).
    assert events.arrivals[-1] - events.arrivals[0] >= 9 * STEP * 0.8, events.arrivals


async def test_auto_on_an_engine_without_metrics_leaves_a_level_it_only_queues_within_seconds(sim: str) -> None:
    """Auto starts at the engine's batch (64), looks at 128, which the engine only queues: the
    canary that waits for its first token sends it back, long before an answer at 128 comes back."""
    config = ClientConfig(concurrency="auto", max_concurrency=256, request_timeout=60, max_retries=0)
    # The canary reads as often as it is wanted here: this is about how fast a queue shows in it (a
    # loaded machine's late read can back off once at the start, and the look up after must come
    # within this short run), not about its share of the time (tests/client/test_autoconc.py).
    settings = AutoSettings(start=BATCH, max_concurrency=256, interval_s=0.25, canary_share=1.0)
    seen: list[tuple[float, int, str]] = []
    async with Client([sim], config, SamplingConfig(max_tokens=OUT), model="sim-model", auto=settings) as client:
        t0 = time.monotonic()

        async def watch() -> None:
            while True:
                for t in client.concurrency_targets():
                    if not seen or seen[-1][1:] != (t.target, t.reason):
                        seen.append((time.monotonic() - t0, t.target, t.reason))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            n = 600
            done = await asyncio.wait_for(asyncio.gather(*(client.chat([{"role": "user", "content": f"q {i}"}])
                                                           for i in range(n))), 120)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        seen_end = time.monotonic() - t0
        stats = client.stats()
    assert len(done) == n and stats.completed == n and not stats.errors, stats  # canaries are not items
    above = [(t, target) for t, target, _ in seen if target > BATCH]
    assert above, seen  # it looked above the batch
    # Sent back by a canary that waited for its first token: "queue" is a verdict only the canary
    # gives an engine without /metrics (answers alone speak of latency).
    backs = [t for t, target, reason in seen if reason == "queue" and target <= BATCH + 16]
    assert backs, seen
    # Within a few control steps of the look (a loose bound: the machine may be loaded); then the
    # target stays at the batch for most of the run. A later look x1.25 (80: 16 queued behind a
    # batch that clears in a tenth of a second) is borderline for any signal and may be kept a while.
    assert backs[0] - above[0][0] < 20 * settings.interval_s + 2.0, seen
    after = [(t, target) for t, target, _ in seen if t >= backs[0]] + [(seen_end, 0)]
    over = sum(b[0] - a[0] for a, b in zip(after, after[1:]) if a[1] > BATCH + 16)
    assert over < 0.3 * (seen_end - backs[0]), seen


async def test_an_endpoint_that_does_not_stream_gives_the_canary_up() -> None:
    calls = 0

    async def send(url: str, arrivals: list[float]) -> TimedEvents:
        nonlocal calls
        calls += 1
        return TimedEvents(200, (0.05,))  # one event: a whole answer, not a stream

    runner = CanaryRunner(send, give_up_after=3)
    readings = []
    for step in range(8):
        readings.append(runner.poll("http://e", float(step)))
        runner.start("http://e", float(step), 10)
        await asyncio.sleep(0)  # the canary's task runs
    await runner.aclose()
    assert runner.given_up and calls == 3, calls
    assert all(r is None or not r.done for r in readings), readings


async def test_canaries_lost_to_a_server_that_is_down_do_not_give_streaming_up() -> None:
    from harvest.transport import Unreachable

    calls = 0

    async def send(url: str, arrivals: list[float]) -> TimedEvents:
        nonlocal calls
        calls += 1
        if calls <= 5:
            raise Unreachable("connection refused")  # the server is restarting
        arrivals.extend([0.05, 0.1, 0.15, 0.2, 0.25])
        return TimedEvents(200, (0.05, 0.1, 0.15, 0.2, 0.25))

    runner = CanaryRunner(send, give_up_after=3)
    readings = []
    for step in range(8):
        readings.append(runner.poll("http://e", float(step)))
        runner.start("http://e", float(step), 10)
        await asyncio.sleep(0)
    await runner.aclose()
    assert not runner.given_up
    done = [r for r in readings if r is not None and r.done]
    assert done and abs(done[0].itl - 0.05) < 1e-9 and done[0].ttft == 0.05, readings


async def test_a_small_target_spares_no_place_for_a_canary(fake_server) -> None:
    """At 8 in flight a canary would hold one eighth of what the engine is sent: no canary there."""
    async def slow(method: str, url: str, body: bytes | None, headers: dict[str, str]):
        await asyncio.sleep(0.01)  # an answer takes a moment: the steering gets its steps
        return fake_server.handler(method, url, body, headers)

    config = ClientConfig(concurrency="auto", max_concurrency=16, request_timeout=30)
    settings = AutoSettings(start=8, max_concurrency=16, interval_s=0.01)
    async with Client(["http://e:1"], config, SamplingConfig(max_tokens=4), model="m", auto=settings,
                      transport=MockTransport(slow)) as client:
        await asyncio.wait_for(asyncio.gather(*(client.chat([{"role": "user", "content": f"q {i}"}])
                                                for i in range(200))), 60)
        steps = [t.reason for t in client.concurrency_targets()]
    assert fake_server.count("GET", "/metrics") >= 1 and steps != ["initial"], steps  # steered without /metrics
    assert not [b for b in fake_server.bodies("/v1/chat/completions") if b.get("stream")]
    assert len(fake_server.bodies("/v1/chat/completions")) == 200


def _streamed() -> RawResponse:
    """A canary's answer: ten streamed events."""
    return RawResponse(200, b"".join(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' for _ in range(10)))


def _answered() -> RawResponse:
    """An item's answer: 4 tokens."""
    answer = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    return RawResponse(200, json.dumps(answer).encode())


@pytest.mark.parametrize(("hint", "items_at_most"), [(128, 64), (64, 63), (None, 63)])
async def test_a_canary_takes_a_place_of_the_target_only_at_the_engines_batch_limit(hint, items_at_most) -> None:
    """Below the engine's batch (transformers' 1024 requests, at 512 in flight) the items keep the
    whole target: one place less adds a wave to a run of equal answers (4096 at 511 is 9 waves).
    At the limit, or with none known, the canary holds one of the target's places."""
    in_flight = peak = streamed = canaries = 0  # peak: items in flight while a canary is

    async def engine(method: str, url: str, body: bytes | None, headers: dict[str, str]):
        nonlocal in_flight, peak, streamed, canaries
        if method == "GET":
            return RawResponse(404, b"not found")  # no /metrics: a canary is how auto steers
        request = json.loads(body or b"{}")
        if request.get("stream"):
            streamed += 1
            canaries += 1
            peak = max(peak, in_flight)
            for _ in range(10):
                await asyncio.sleep(0.005)
                peak = max(peak, in_flight)
            canaries -= 1
            return _streamed()
        in_flight += 1
        if canaries:
            peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return _answered()

    config = ClientConfig(concurrency="auto", max_concurrency=64, request_timeout=30)
    settings = AutoSettings(start=64, max_concurrency=64, interval_s=0.02, batch_hint=hint, canary_share=1.0)
    async with Client(["http://e:1"], config, SamplingConfig(max_tokens=4), model="m", auto=settings,
                      transport=MockTransport(engine)) as client:
        await asyncio.wait_for(asyncio.gather(*(client.chat([{"role": "user", "content": f"q {i}"}])
                                                for i in range(1500))), 60)
        assert client.stats().completed == 1500
    assert streamed >= 3, streamed  # the canary ran
    assert peak == items_at_most, (peak, hint)


@pytest.mark.parametrize(("ceiling_steps", "streams"), [(100_000, False), (5, True)])
async def test_a_held_start_streams_no_canary_until_its_ceiling_lifts(ceiling_steps, streams) -> None:
    """A canary is not free (H200, BENCHMARKS P7 A1, measured on 2026-12-02: transformers serve made
    x0.63-0.65 of fixed 512's tok/s with one streamed back to back beside it). Held at half a batch limit
    harvest knows, auto has nothing to judge until the hold ends: no canary is sent before, and the items
    keep every place of the target."""
    streamed = in_flight = peak = 0

    async def engine(method: str, url: str, body: bytes | None, headers: dict[str, str]):
        nonlocal streamed, in_flight, peak
        if method == "GET":
            return RawResponse(404, b"not found")  # no /metrics: auto steers on a canary
        if json.loads(body or b"{}").get("stream"):
            streamed += 1
            return _streamed()
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return _answered()

    config = ClientConfig(concurrency="auto", max_concurrency=64, request_timeout=30)
    settings = AutoSettings(start=32, max_concurrency=64, interval_s=0.01, batch_hint=64,
                            ceiling_steps=ceiling_steps, canary_share=1.0)
    async with Client(["http://e:1"], config, SamplingConfig(max_tokens=4), model="m", auto=settings,
                      transport=MockTransport(engine)) as client:
        await asyncio.wait_for(asyncio.gather(*(client.chat([{"role": "user", "content": f"q {i}"}])
                                                for i in range(1000))), 60)
        assert client.stats().completed == 1000
        target = client.concurrency_targets()[0]
    assert (streamed > 0) is streams, (streamed, target)
    if not streams:
        assert target.target == 32 and peak == 32, (target, peak)  # held, every place the items'


async def test_a_canary_that_failed_unread_leaves_nothing_for_asyncio_to_report() -> None:
    """A canary timed out on a hung endpoint the steering no longer reads, then the client closes:
    its failure must not surface as "Task exception was never retrieved"."""
    import gc

    from harvest.transport import TimedOut

    reported: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))

    async def times_out(url: str, arrivals: list[float]) -> TimedEvents:
        raise TimedOut("no complete response within 60 s")

    runner = CanaryRunner(times_out)
    runner.start("http://127.0.0.1:9", time.monotonic(), outstanding=3)
    await asyncio.sleep(0.05)  # it failed; nobody polls it
    await runner.aclose()
    gc.collect()
    await asyncio.sleep(0)
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported
