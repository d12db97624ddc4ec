"""Endpoint URLs, least-outstanding choice and state changes of the pool."""

from __future__ import annotations

import asyncio

import pytest

from harvest.client.endpoints import EndpointPool, normalize_url
from harvest.client.records import EndpointState
from harvest.errors import ConfigError


@pytest.mark.parametrize("url, base", [
    ("http://h:8000", "http://h:8000"), ("http://h:8000/", "http://h:8000"), ("http://h:8000/v1", "http://h:8000"),
    ("https://api.example.com/v1/", "https://api.example.com"), ("http://[::1]:30000", "http://[::1]:30000"),
])
def test_normalize_url(url, base):
    assert normalize_url(url) == base


@pytest.mark.parametrize("url", ["h:8000", "ftp://h", "http://", "http:///x"])
def test_normalize_url_refuses(url):
    with pytest.raises(ConfigError):
        normalize_url(url)


def test_choice_is_least_outstanding_then_round_robin_and_skips_unhealthy():
    pool = EndpointPool(["http://a:1", "http://b:1", "http://c:1"])
    a, b, c = pool.endpoints
    assert [pool.choose().url for _ in range(6)] == ["http://a:1", "http://b:1", "http://c:1"] * 2
    a.outstanding, b.outstanding, c.outstanding = 2, 0, 1
    assert {pool.choose() for _ in range(5)} == {b}
    pool.set_state(b, EndpointState.SICK)
    assert {pool.choose() for _ in range(5)} == {c}
    pool.set_state(a, EndpointState.DOWN)
    pool.set_state(c, EndpointState.SICK)
    assert pool.choose() is None and not pool.all_down()
    pool.set_state(b, EndpointState.DOWN)
    pool.set_state(c, EndpointState.DOWN)
    assert pool.all_down()


async def test_waiters_wake_on_a_state_change_and_time_out_otherwise():
    pool = EndpointPool(["http://a:1"])
    assert await pool.wait_changed(0.01) is False
    waiter = asyncio.create_task(pool.wait_changed(5))
    await asyncio.sleep(0)
    assert pool.set_state(pool.endpoints[0], EndpointState.SICK)
    assert await asyncio.wait_for(waiter, 1) is True
    assert pool.set_state(pool.endpoints[0], EndpointState.SICK) is False
