"""Client.replace_endpoint: an endpoint follows its replacement server (a Ray run's lost node)."""

from __future__ import annotations

import asyncio

import pytest

from harvest.client import EndpointState, RawResponse, Unreachable
from harvest.errors import ServerSick
from tests.client.fakes import FakeServer, FakeTime, chat_response
from tests.client.test_client_core import CHAT, MSG, A, B, make_client

C = "http://c.test:8000"
REFUSED = Unreachable("ClientConnectorError: Connect call failed")


def only_c_lives(server: FakeServer) -> None:
    server.routes[("POST", CHAT)] = lambda base: chat_response(f"from {base}") if base == C else REFUSED
    server.routes[("GET", "/health")] = lambda base: RawResponse(200, b"") if base == C else REFUSED


async def test_a_held_request_goes_to_the_replacement_uncharged(fake_server: FakeServer, fake_time: FakeTime):
    only_c_lives(fake_server)
    async with make_client(fake_server, fake_time, retries=0, deadline=600.0) as client:
        task = asyncio.create_task(client.chat(MSG))
        for _ in range(1000):
            if client.stats().endpoints[0].state is EndpointState.SICK:
                break
            await asyncio.sleep(0)
        assert client.stats().endpoints[0].state is EndpointState.SICK
        client.replace_endpoint(A, C)
        done = await asyncio.wait_for(task, 5)
        assert client.endpoints == (C,)
        assert client.stats().endpoints[0].state is EndpointState.HEALTHY
    assert done.text == f"from {C}" and done.endpoint == C and done.attempts == 1
    assert fake_server.count("POST", CHAT, C) == 1


async def test_a_down_endpoint_comes_back_through_its_replacement(fake_server, fake_time):
    only_c_lives(fake_server)
    async with make_client(fake_server, fake_time, deadline=10.0) as client:
        with pytest.raises(ServerSick):
            await client.chat(MSG)
        assert client.stats().endpoints[0].state is EndpointState.DOWN
        client.replace_endpoint(A, C)
        done = await asyncio.wait_for(client.chat(MSG), 5)
    assert done.endpoint == C and done.attempts == 1


async def test_replacing_one_of_two_keeps_the_other(fake_server, fake_time):
    async with make_client(fake_server, fake_time, endpoints=(A, B)) as client:
        client.replace_endpoint(A + "/v1", C)
        assert client.endpoints == (C, B)
        with pytest.raises(ValueError):
            client.replace_endpoint(A, C)  # A is no endpoint any more
        with pytest.raises(ValueError):
            client.replace_endpoint(C, B)  # B already is one
