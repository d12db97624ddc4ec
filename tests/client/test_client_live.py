"""The client with its real aiohttp transport against real HTTP servers on 127.0.0.1 (subprocesses
killed by pid): outages and restarts, two endpoints, deadlines, timeouts, secrets, /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import urllib.request

import pytest

from harvest.client import Client, EndpointState, RetryPolicy, scrape_metrics
from harvest.config import ClientConfig, SamplingConfig
from harvest.errors import RequestError, ServerSick

MSG = [{"role": "user", "content": "hello"}]
FAST = RetryPolicy(health_interval=0.05, health_interval_cap=0.2, backoff_base=0.05, probe_timeout=2.0)


def client_for(urls, *, retries=0, deadline=30.0, timeout=10.0, concurrency=8, **kwargs) -> Client:
    config = ClientConfig(concurrency=concurrency, max_retries=retries, health_deadline=deadline,
                          request_timeout=timeout)
    return Client(list(urls), config, SamplingConfig(max_tokens=8), model="live-model", retry=FAST, **kwargs)


def chat_count(url: str) -> int:
    with urllib.request.urlopen(url + "/stats", timeout=5) as resp:
        return json.loads(resp.read())["chat"]


async def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.01)


async def wait_for_chats(url: str, count: int, timeout: float = 10.0) -> None:
    """Until the server at ``url`` has received ``count`` chat requests (asked off the event loop)."""
    deadline = time.monotonic() + timeout
    while await asyncio.to_thread(chat_count, url) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not receive {count} chat requests within {timeout} s")
        await asyncio.sleep(0.02)


def refusing_port() -> socket.socket:
    """A socket bound to a loopback port but not listening: connections to it are refused, and no
    other process can take the port while the test holds it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


async def test_two_endpoints_both_receive_traffic(live_servers):
    one, two = live_servers(), live_servers()
    async with client_for([one.url, two.url]) as client:
        results = await asyncio.gather(*(client.chat(MSG) for _ in range(40)))
    by_endpoint = {url: sum(r.endpoint == url for r in results) for url in (one.url, two.url)}
    assert by_endpoint[one.url] > 0 and by_endpoint[two.url] > 0
    assert chat_count(one.url) == by_endpoint[one.url] and chat_count(two.url) == by_endpoint[two.url]
    assert {r.text for r in results} == {f"reply from {one.port}", f"reply from {two.port}"}
    assert all(r.reasoning_content == "saw 1 messages" and r.completion_tokens == 4 for r in results)


async def test_connection_refused_then_server_back_succeeds_without_charge(live_servers):
    first = live_servers()
    port = first.port
    first.kill()
    async with client_for([first.url], retries=0) as client:
        task = asyncio.create_task(client.chat(MSG))
        await wait_until(lambda: client.stats().held == 1)
        assert client.stats().endpoints[0].state is EndpointState.SICK
        back = live_servers(port=port)
        done = await asyncio.wait_for(task, 20)
        stats = client.stats()
    assert done.attempts == 1 and done.text == f"reply from {port}"
    assert stats.retries == 0 and stats.errors == {"unreachable": 1}
    assert chat_count(back.url) == 1


async def test_server_killed_mid_request_then_restarted_charges_nothing(live_servers):
    hanging = live_servers("--hang-chat")
    port = hanging.port
    async with client_for([hanging.url], retries=0) as client:
        task = asyncio.create_task(client.chat(MSG))
        await wait_for_chats(hanging.url, 1)
        hanging.kill()  # SIGKILL by pid: the request's connection dies under it
        await wait_until(lambda: client.stats().held == 1)
        live_servers(port=port)
        done = await asyncio.wait_for(task, 20)
        errors = client.stats().errors
    assert done.attempts == 1 and done.text == f"reply from {port}"
    assert errors == {"interrupted": 1}


async def test_health_deadline_exceeded_raises_server_sick():
    sock = refusing_port()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with client_for([url], deadline=1.0) as client:
            started = time.monotonic()
            with pytest.raises(ServerSick) as caught:
                await asyncio.wait_for(client.chat(MSG), 15)
            elapsed = time.monotonic() - started
    finally:
        sock.close()
    assert 1.0 <= elapsed < 10.0
    assert caught.value.endpoint == url
    assert "Cannot connect" in str(caught.value) or "refused" in str(caught.value).lower()


async def test_request_timeout_on_a_live_server_fails_the_item(live_servers):
    slow = live_servers("--chat-delay", "5")
    async with client_for([slow.url], retries=0, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(RequestError, match="no complete response within 0.3 s"):
            await client.chat(MSG)
        assert time.monotonic() - started < 3.0
        stats = client.stats()
    assert stats.errors == {"timeout": 1}
    assert stats.endpoints[0].state is EndpointState.HEALTHY


async def test_api_key_never_appears_in_exceptions_or_logs(live_servers, caplog):
    secret = "sk-live-abcdefghijklmnop0123"
    caplog.set_level(logging.DEBUG)
    server = live_servers("--api-key", "the-right-key")
    sock = refusing_port()
    gone = f"http://127.0.0.1:{sock.getsockname()[1]}"
    texts = []
    try:
        async with client_for([server.url], api_key=secret) as client:
            with pytest.raises(RequestError) as rejected:
                await client.chat(MSG)
            texts += [str(rejected.value), repr(rejected.value), repr(client), repr(client.stats())]
        async with client_for([gone], api_key=secret, deadline=0.5) as client:
            with pytest.raises(ServerSick) as sick:
                await client.chat(MSG)
            texts += [str(sick.value), repr(sick.value), repr(client.stats())]
    finally:
        sock.close()
    assert rejected.value.status == 401 and "Incorrect API key provided: ***" in str(rejected.value)
    assert any("sick" in r.getMessage() for r in caplog.records)
    texts.append(caplog.text)
    for text in texts:
        assert secret not in text


async def test_scrape_metrics_from_a_live_server(live_servers):
    with_metrics, without = live_servers("--metrics"), live_servers()
    totals = await scrape_metrics(with_metrics.url)
    assert totals == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 7.0}
    assert await scrape_metrics(without.url) == {}
    async with client_for([with_metrics.url, without.url]) as client:
        assert await client.scrape_metrics() == {with_metrics.url: totals, without.url: {}}
