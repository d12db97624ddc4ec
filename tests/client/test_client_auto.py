"""``concurrency = "auto"`` inside the client: per-endpoint limits gate dispatch, the steering loop
moves them from the engines' /metrics, and the targets show in stats."""

from __future__ import annotations

import asyncio
import json
from collections import deque

import pytest
from pydantic import ValidationError

from harvest.client import Client, MockTransport, RawResponse
from harvest.client.autoconc import AutoSettings
from harvest.client.endpoints import EndpointPool
from harvest.client.records import EndpointState
from harvest.config import ClientConfig

A, B = "http://a:1", "http://b:1"


def answer(tokens: int = 8) -> RawResponse:
    body = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": tokens}}
    return RawResponse(200, json.dumps(body).encode())


def vllm_metrics(running: float, waiting: float, generated: float) -> RawResponse:
    """vLLM's /metrics, the lines auto reads."""
    return RawResponse(200, (f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
                             f"vllm:generation_tokens_total {generated}\n").encode())


def auto_client(urls: list[str], handler, *, start: int, max_concurrency: int, interval_s: float = 1.0) -> Client:
    """A client under ``concurrency = "auto"`` over ``urls`` answered by ``handler``, starting at ``start``."""
    config = ClientConfig(concurrency="auto", auto_start=start, max_concurrency=max_concurrency)
    return Client(urls, config, model="m", transport=MockTransport(handler),
                  auto=AutoSettings(start=start, max_concurrency=max_concurrency, interval_s=interval_s))


def by_hand(client: Client):
    """The client's steering stepped by the test: each call moves its clock 1 s and runs one step."""
    steer = client._steer
    assert steer is not None
    clock = [0.0]
    steer._clock = lambda: clock[0]

    async def step() -> None:
        clock[0] += 1.0
        await steer.step()
    return step


class TwoSpeeds:
    """A slow endpoint (A, each request waits for a release) and a fast one (B, answers at once);
    records the most requests each held at once."""

    def __init__(self) -> None:
        self.release_a = asyncio.Event()
        self.now = {A: 0, B: 0}
        self.most = {A: 0, B: 0}
        self.done = {A: 0, B: 0}

    async def handler(self, method: str, url: str, body: bytes | None, headers: dict[str, str]) -> RawResponse:
        base = url.split("/v1/")[0].split("/metrics")[0]
        if url.endswith("/metrics"):
            return RawResponse(404, b"")
        self.now[base] += 1
        self.most[base] = max(self.most[base], self.now[base])
        try:
            if base == A:
                await self.release_a.wait()
            else:
                await asyncio.sleep(0)
        finally:
            self.now[base] -= 1
        self.done[base] += 1
        return answer()


async def test_a_full_slow_endpoint_does_not_hold_up_the_fast_one():
    server = TwoSpeeds()
    async with auto_client([A, B], server.handler, start=2, max_concurrency=4, interval_s=3600) as client:
        tasks = [asyncio.create_task(client.chat([{"role": "user", "content": str(i)}])) for i in range(40)]
        # A holds its 2 and never answers until released; all the others go through B meanwhile.
        while server.done[B] < 38:
            await asyncio.wait(tasks, timeout=0.05)
        assert server.now[A] == 2 and server.most[A] == 2
        assert server.most[B] <= 2
        stats = client.stats()
        assert {e.url: e.target for e in stats.endpoints} == {A: 2, B: 2}
        assert [t.target for t in client.concurrency_targets()] == [2, 2]
        assert client.capacity() == 4
        server.release_a.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert server.done == {A: 2, B: 38}


async def test_fixed_concurrency_has_no_per_endpoint_target():
    server = TwoSpeeds()
    server.release_a.set()
    async with Client([A, B], ClientConfig(concurrency=3), model="m", transport=MockTransport(server.handler)) as client:
        await asyncio.gather(*(client.chat([{"role": "user", "content": "q"}]) for _ in range(6)))
        assert client.concurrency_targets() == ()
        assert client.capacity() == 3
        assert all(e.target is None for e in client.stats().endpoints)


async def test_steering_raises_the_target_in_seconds_while_the_engine_runs_all_it_is_sent_and_makes_more():
    generated = 0.0
    running = 2

    async def handler(method, url, body, headers):
        if url.endswith("/metrics"):
            return vllm_metrics(running, 0, generated)
        return answer()

    async with auto_client([A], handler, start=2, max_concurrency=64) as client:
        step_steering = by_hand(client)
        seen = []
        for _ in range(24):  # the engine runs every request it holds, none waits, tok/s follows
            running = client.concurrency_targets()[0].target
            client._pool.endpoints[0].peak = running  # the client kept its target in flight
            generated += 100.0 * running
            await step_steering()
            seen.append(client.concurrency_targets()[0].target)
        # a doubling every few scrapes (a level judged on three scrapes of the token counter), not
        # per answer latency, up to the bound
        assert sorted(seen) == seen and seen[0] <= 4, seen
        assert seen.index(64) <= 21, seen
        assert seen[-1] == 64, seen
        assert client.concurrency_targets()[0].gauges
        # a client that does not keep the endpoint busy gets no rise (no verdict on more)
        client._pool.endpoints[0].peak = 0
        running = 64
        await step_steering()
        assert client.concurrency_targets()[0].target == 64
        assert client.concurrency_targets()[0].reason in ("not filled", "hold")
        assert client.stats().endpoints[0].target == seen[-1]


async def test_room_waiters_wake_first_come_first_served():
    pool = EndpointPool([A])
    endpoint = pool.endpoints[0]
    pool.set_limit(endpoint, 1)
    endpoint.outstanding = 1
    assert pool.choose() is None and pool.any_healthy()
    first = asyncio.create_task(pool.wait_room(5))
    second = asyncio.create_task(pool.wait_room(5))
    await asyncio.sleep(0)
    pool.release(endpoint)
    assert await asyncio.wait_for(first, 1) is True
    await asyncio.sleep(0)
    assert not second.done()
    pool.set_limit(endpoint, 3)  # a raised limit wakes the rest
    assert await asyncio.wait_for(second, 1) is True
    assert await pool.wait_room(0.01) is False


async def test_a_woken_room_waiter_costs_no_scan_and_a_timed_out_one_leaves_the_queue():
    """With every request of a dataset asked for at once, thousands of callers wait for room: the one
    a release wakes is already off the queue, so its exit must not search the queue for it (a scan
    of every waiter for each request that ends). One that times out or is cancelled leaves it."""

    class Counted(deque):
        scans = 0

        def remove(self, value):
            Counted.scans += 1
            return super().remove(value)

    pool = EndpointPool([A])
    endpoint = pool.endpoints[0]
    pool.set_limit(endpoint, 1)
    endpoint.outstanding = 1
    pool._room = Counted()
    waiters = [asyncio.create_task(pool.wait_room(30)) for _ in range(200)]
    await asyncio.sleep(0)
    assert len(pool._room) == 200
    for k in range(50):  # 50 requests end, one after another: each wakes the first waiter
        pool.release(endpoint)
        endpoint.outstanding += 1
        assert await asyncio.wait_for(waiters[k], 1) is True
    assert Counted.scans == 0 and len(pool._room) == 150
    waiters[60].cancel()  # a cancelled caller leaves the queue, in its place
    await asyncio.gather(waiters[60], return_exceptions=True)
    assert len(pool._room) == 149 and Counted.scans == 1
    pool.release(endpoint)  # the next one woken is the first still waiting, in order
    assert await asyncio.wait_for(waiters[50], 1) is True
    assert [w.done() for w in waiters[51:60]] == [False] * 9
    late = await pool.wait_room(0.01)  # a timed-out caller leaves the queue too
    assert late is False and len(pool._room) == 148
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert len(pool._room) == 0


@pytest.mark.parametrize("fields, ok", [
    ({"concurrency": "auto"}, True), ({"concurrency": 12}, True), ({"concurrency": 0}, False),
    ({"concurrency": "fast"}, False), ({"concurrency": "auto", "auto_start": 1100}, False), ({}, True),
])
def test_client_config_concurrency_is_a_number_or_auto(fields, ok):
    if ok:
        config = ClientConfig(**fields)
        assert config.auto == (fields.get("concurrency", "auto") == "auto")  # "auto" is the default
    else:
        with pytest.raises(ValidationError):
            ClientConfig(**fields)


async def test_steering_comes_back_when_a_step_up_the_engine_takes_makes_no_more_tokens():
    """vLLM CPU admitted 512 at once with no queue and made fewer tok/s than at 64 (BENCHMARKS P7 A2):
    an engine that runs all it is sent is not reason enough, the token counter must grow too."""
    generated = 0.0

    async def handler(method, url, body, headers):
        if url.endswith("/metrics"):
            return vllm_metrics(client.concurrency_targets()[0].target, 0, generated)
        return answer()

    async with auto_client([A], handler, start=16, max_concurrency=512) as client:
        step_steering = by_hand(client)
        seen = []
        for i in range(50):
            target = client.concurrency_targets()[0].target
            if i >= 40 and target == 16:
                break  # the run ends back at 16 (not inside a later look)
            client._pool.endpoints[0].peak = target
            generated += 1000.0 * (1.0 if target <= 16 else 0.9)  # more in flight: a little less
            await step_steering()
            seen.append(client.concurrency_targets()[0].target)
        assert max(seen) == 32, seen  # it looked one step up...
        # ...and came back within a few scrapes, and stayed, but for one more look now and then
        stints = "".join("u" if t == 32 else "." for t in seen).split(".")
        assert max(len(st) for st in stints) <= 4 and seen.count(16) >= 30 and seen[-1] == 16, seen
        assert client.concurrency_targets()[0].reason in {"no gain", "hold"}, client.concurrency_targets()


async def test_each_target_shows_the_engine_queue_of_the_steerings_own_scrape():
    """A display (and the bench's trace) reads the queue from the scrape the steering made, instead
    of scraping /metrics again: on 2 cores one more scrape a second cost vLLM CPU x0.94 of its tok/s.
    An endpoint without /metrics has no queue to show."""
    scrapes = {A: 0, B: 0}

    async def handler(method, url, body, headers):
        base = url.split("/v1/")[0].split("/metrics")[0]
        if url.endswith("/metrics"):
            scrapes[base] += 1
            if base == B:
                return RawResponse(404, b"")
            return RawResponse(200, b"vllm:num_requests_running 8\nvllm:num_requests_waiting 3\n"
                                    b"vllm:generation_tokens_total 100\n")
        return answer()

    async with auto_client([A, B], handler, start=8, max_concurrency=64) as client:
        steer = client._steer
        assert steer is not None
        assert [t.queue for t in client.concurrency_targets()] == [None, None]  # nothing scraped yet
        await steer.step()
        queues = {t.url: t.queue for t in client.concurrency_targets()}
        assert queues == {A: 3.0, B: None}, queues
        assert scrapes == {A: 1, B: 1}, scrapes  # reading the targets scraped nothing more


async def test_a_settled_engine_is_scraped_less_often_and_at_once_again_when_it_changes():
    """A scrape is not free (on 2 cores one a second cost vLLM CPU x0.94 of its tok/s, BENCHMARKS
    P7 A2). An engine settled with nothing to move soon (full, its queue at the slack) is scraped
    every 2, 4, then 8 steps; when a scrape shows it changed, every step again. The display then
    says "hold", not "not filled": the client keeps it busy and its queue is short on purpose."""
    generated, runs, scraped = 0.0, 12, []

    async def handler(method, url, body, headers):
        if url.endswith("/metrics"):
            scraped.append(step)
            target = client.concurrency_targets()[0].target
            return vllm_metrics(min(target, runs), target - min(target, runs), generated)
        return answer()

    async with auto_client([A], handler, start=16, max_concurrency=64) as client:
        step_steering = by_hand(client)
        targets = []
        for step in range(80):
            if step == 50:
                runs = 6  # the engine now runs fewer at once (another client, a slower model)
            client._pool.endpoints[0].peak = client.concurrency_targets()[0].target
            generated += 1000.0
            await step_steering()
            targets.append(client.concurrency_targets()[0])
    settled = targets[49]
    assert (settled.target, settled.phase, settled.reason) == (14, "settled", "hold"), settled
    quiet = [s for s in scraped if 10 <= s < 50]
    assert len(quiet) <= 6 and max(b - a for a, b in zip(quiet, quiet[1:])) == 8, scraped
    seen = next(s for s in scraped if s >= 50)  # the first scrape of the change: within 8 steps
    moved = next(i for i in range(50, 80) if targets[i].target < 14)  # once its old peaks aged out
    assert seen < 58 and moved <= seen + 5 and targets[moved].target == 8, (scraped, targets[seen:moved + 1])
    assert set(range(seen, moved + 3)) <= set(scraped), scraped  # every step while it moves


async def test_an_endpoint_back_from_sick_is_scraped_at_once_though_it_was_settled() -> None:
    """An endpoint paused as sick may come back as a restarted engine: its first step back scrapes."""
    scraped = []

    async def handler(method, url, body, headers):
        if url.endswith("/metrics"):
            scraped.append(step)
            return vllm_metrics(12, 2, 1000.0 * step)
        return answer()

    async with auto_client([A], handler, start=14, max_concurrency=64) as client:
        step_steering = by_hand(client)
        endpoint = client._pool.endpoints[0]
        for step in range(30):
            endpoint.peak = 14
            if step == 20:
                client._pool.set_state(endpoint, EndpointState.SICK)
            if step == 22:
                client._pool.set_state(endpoint, EndpointState.HEALTHY)
            await step_steering()
    assert [s for s in scraped if s < 20] == [0, 1, 3, 7, 15], scraped  # settled: every 2, 4, 8 steps
    assert 22 in scraped, scraped  # back healthy: scraped in its first step, not on the old beat (25)


async def test_each_server_endpoint_starts_and_stops_at_its_own_engines_batch():
    """Servers launched with batch limits of their own (a ``[[hosts]]`` entry overriding
    ``max_running_requests``) each start at their batch plus a short queue and stay there while the
    engine runs its whole batch; a [client] endpoint, which may be any engine, starts at [server]'s
    batch as a guess. URLs and engine limits that do not pair up are refused."""
    from harvest.campaign.run import engine_limit
    from harvest.config import parse_config

    C = "http://c:1"
    cfg = parse_config({"server": {"engine": "vllm", "model": "/m", "max_running_requests": 16},
                        "client": {"concurrency": "auto", "endpoints": [C]}})
    assert cfg.server is not None
    big = cfg.server.model_copy(update={"max_running_requests": 64})
    running = {A: 16.0, B: 64.0, C: 16.0}

    async def handler(method: str, url: str, body: bytes | None, headers: dict[str, str]) -> RawResponse:
        base = url.split("/metrics")[0]
        return vllm_metrics(running[base], 0, 1000.0)  # its whole batch runs, nothing waits

    engines = [engine_limit(cfg.server), engine_limit(big)]  # what harvest run passes in
    client = Client.from_config(cfg, [A, B], engines, engine=engine_limit(cfg.server),
                                transport=MockTransport(handler))
    async with client:
        step = by_hand(client)
        assert {t.url: t.target for t in client.concurrency_targets()} == {A: 18, B: 72, C: 16}
        for _ in range(4):
            await step()
        targets = {t.url: (t.target, t.reason) for t in client.concurrency_targets()}
        assert targets[A] == (18, "at the engine's batch limit")
        assert targets[B] == (72, "at the engine's batch limit")
    with pytest.raises(ValueError, match="2 engine limits for 1 server URLs"):
        Client.from_config(cfg, [A], engines, transport=MockTransport(handler))
