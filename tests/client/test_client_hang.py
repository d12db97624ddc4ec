"""A hung endpoint, as the client finds it: requests in flight, nothing back past the bound of its
own answers, no generated token counted, while /health answers (harvest.client.hang).

The quiet spells are measured in real time, so the bound's floor is shortened here (``hang_floor``
0.4 s, a look every 0.05 s); the completions that hang wait on an event the test holds.
"""

from __future__ import annotations

import asyncio

import pytest

from harvest.client import Client, EndpointState, RawResponse, RetryPolicy
from harvest.config import ClientConfig, SamplingConfig
from harvest.errors import ServerSick
from harvest.transport import MockTransport, Unreachable
from tests.client.fakes import FakeServer, chat_response

A = "http://a.test:8000"
B = "http://b.test:8000"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello"}]
FLOOR = 0.4


def make_client(server: FakeServer, endpoints=(A,), *, deadline: float = 60.0) -> Client:
    # request_timeout far beyond the test: nothing here may rest on it
    config = ClientConfig(concurrency=8, max_retries=0, health_deadline=deadline, request_timeout=3600)
    return Client(list(endpoints), config, SamplingConfig(max_tokens=8), model="m",
                  transport=MockTransport(server.handler),
                  retry=RetryPolicy(hang_floor=FLOOR, hang_interval=0.05, health_interval=0.05, probe_timeout=1))


def holding(release: asyncio.Event, hang_on: set[str]):
    """Completions that answer at once, except on the endpoints in ``hang_on``: held until ``release``."""
    async def answer(base: str) -> RawResponse:
        if base in hang_on:
            await release.wait()
        return chat_response(base)

    return answer


async def wait_state(client: Client, index: int, state: EndpointState, timeout: float = 10.0) -> None:
    async def reached() -> None:
        while client.stats().endpoints[index].state is not state:
            await asyncio.sleep(0.02)
    await asyncio.wait_for(reached(), timeout)


async def test_quiet_endpoint_whose_health_answers_is_hung_gets_no_new_request_and_answers_bring_it_back():
    server, release = FakeServer(), asyncio.Event()
    server.routes[("POST", CHAT)] = holding(release, {A})
    async with make_client(server) as client:
        held = [asyncio.create_task(client.chat(MSG)) for _ in range(3)]
        await wait_state(client, 0, EndpointState.HUNG)
        stats = client.stats().endpoints[0]
        assert stats.hung_s is not None and stats.hung_s >= FLOOR
        assert stats.last_error.startswith("hung: no answer for ") and stats.last_error.endswith("while /health answered")
        sent = server.count("POST", CHAT)
        late = asyncio.create_task(client.chat(MSG))  # waits: no endpoint in rotation
        await asyncio.sleep(0.3)
        assert server.count("POST", CHAT) == sent and not late.done()
        release.set()  # the engine answers after all: back in rotation, nothing charged
        done = await asyncio.wait_for(asyncio.gather(*held, late), 10)
        assert client.stats().endpoints[0].state is EndpointState.HEALTHY
    assert all(c.attempts == 1 for c in done)


async def test_hung_endpoint_is_down_after_health_deadline_and_its_requests_raise_server_sick_uncharged():
    server, release = FakeServer(), asyncio.Event()
    server.routes[("POST", CHAT)] = holding(release, {A})
    async with make_client(server, deadline=0.5) as client:
        held = [asyncio.create_task(client.chat(MSG)) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), 15)
        stats = client.stats()
    assert all(isinstance(r, ServerSick) for r in results), results
    assert "hung: no answer for" in str(results[0])
    assert stats.endpoints[0].state is EndpointState.DOWN and stats.in_flight == 0
    assert stats.errors.get("abandoned") == 3 and stats.retries == 0


async def test_with_two_endpoints_the_hung_one_is_drained_and_its_requests_finish_on_the_other():
    server, release = FakeServer(), asyncio.Event()
    server.routes[("POST", CHAT)] = holding(release, {A})
    async with make_client(server, endpoints=(A, B), deadline=0.5) as client:
        results = await asyncio.wait_for(asyncio.gather(*(client.chat(MSG) for _ in range(8))), 15)
        assert client.stats().endpoints[0].state is EndpointState.DOWN
        more = await asyncio.wait_for(asyncio.gather(*(client.chat(MSG) for _ in range(8))), 15)
    assert {r.endpoint for r in results + more} == {B}
    assert all(r.attempts == 1 for r in results + more)


async def test_a_moving_token_counter_means_long_answers_not_a_hang():
    server, release = FakeServer(), asyncio.Event()
    server.routes[("POST", CHAT)] = holding(release, {A})
    generated = {"n": 0.0}

    def metrics(base: str) -> RawResponse:
        generated["n"] += 5
        return RawResponse(200, f"llamacpp:tokens_predicted_total {generated['n']}\n".encode())

    server.routes[("GET", "/metrics")] = metrics
    async with make_client(server) as client:
        held = [asyncio.create_task(client.chat(MSG)) for _ in range(2)]
        await asyncio.sleep(FLOOR * 5)
        assert client.stats().endpoints[0].state is EndpointState.HEALTHY
        assert server.count("GET", "/metrics") >= 3
        generated["n"] = -1e9  # the counter stops: now it is hung
        server.routes[("GET", "/metrics")] = [RawResponse(200, b"llamacpp:tokens_predicted_total 7\n")]
        await wait_state(client, 0, EndpointState.HUNG)
        release.set()
        await asyncio.wait_for(asyncio.gather(*held), 10)


async def test_quiet_endpoint_whose_health_fails_is_sick_not_hung():
    server, release = FakeServer(), asyncio.Event()
    server.routes[("POST", CHAT)] = holding(release, {A})

    def health(base: str) -> RawResponse:
        if not release.is_set():
            raise Unreachable("refused")
        return RawResponse(200, b"")

    server.routes[("GET", "/health")] = health
    async with make_client(server) as client:
        held = asyncio.create_task(client.chat(MSG))
        await wait_state(client, 0, EndpointState.SICK)
        assert client.stats().endpoints[0].hung_s is None
        release.set()  # SIGCONT: it answers /health and the request that waited on it
        assert (await asyncio.wait_for(held, 10)).attempts == 1
        await wait_state(client, 0, EndpointState.HEALTHY)


@pytest.mark.parametrize("answers", [1, 3])
async def test_the_bound_grows_with_the_endpoints_own_latency(answers):
    server = FakeServer()

    async def slow(base: str) -> RawResponse:
        await asyncio.sleep(0.3)
        return chat_response(base)

    server.routes[("POST", CHAT)] = slow
    async with make_client(server) as client:
        for _ in range(answers):
            await client.chat(MSG)
        bound = client.stats().endpoints[0].hung_after_s
    assert bound is not None and 0.9 <= bound < 5  # 3 x its p90 (0.3 s), above the 0.4 s floor given here
