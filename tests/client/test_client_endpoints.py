"""Endpoint URLs, least-outstanding choice and state changes of the pool."""

from __future__ import annotations

import asyncio

import pytest

from harvest.client.endpoints import HUNG_MIN_S, Abandoned, Endpoint, EndpointPool, normalize_url
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


# --- prefix affinity ---------------------------------------------------------------------

def take(pool: EndpointPool, key: str | None):
    endpoint = pool.choose(key)
    assert endpoint is not None
    endpoint.outstanding += 1
    return endpoint


def test_a_key_goes_to_one_server_while_the_loads_are_even():
    pool = EndpointPool(["http://a:1", "http://b:1"])
    keys = [f"prefix-{i}" for i in range(40)]
    home = {}
    for _ in range(5):  # five rounds of one request per key, each answered before the next round
        for key in keys:
            endpoint = take(pool, key)
            home.setdefault(key, endpoint.url)
            assert endpoint.url == home[key], key  # the same key, the same server
        for e in pool.endpoints:
            e.outstanding = 0
    counts = {url: sum(1 for u in home.values() if u == url) for url in ("http://a:1", "http://b:1")}
    assert min(counts.values()) >= 10, counts  # the keys spread over both


def test_a_hot_key_spills_to_the_next_server_past_its_bounded_load():
    pool = EndpointPool(["http://a:1", "http://b:1"])
    chosen = [take(pool, "one hot system prompt").url for _ in range(100)]
    counts = {url: chosen.count(url) for url in set(chosen)}
    assert len(counts) == 2, counts
    assert max(counts.values()) <= 70, counts  # within 1.25 x the average (plus rounding)


def test_a_lagging_server_sheds_its_keys_and_a_dead_one_gets_none():
    pool = EndpointPool(["http://a:1", "http://b:1", "http://c:1"])
    a, b, _ = pool.endpoints
    keys = [f"k{i}" for i in range(60)]
    a.outstanding = 50  # a lags: its requests pile up
    picks = [take(pool, key) for key in keys]
    assert sum(1 for e in picks if e is a) == 0
    for e in pool.endpoints:
        e.outstanding = 0
    pool.set_state(b, EndpointState.SICK)
    homes_without_b = {}
    for key in keys:  # one at a time, each answered: where each key lives
        homes_without_b[key] = take(pool, key).url
        for e in pool.endpoints:
            e.outstanding = 0
    assert "http://b:1" not in homes_without_b.values()
    pool.set_state(b, EndpointState.HEALTHY)
    homes = {}
    for key in keys:
        homes[key] = take(pool, key).url
        for e in pool.endpoints:
            e.outstanding = 0
    moved = [k for k in keys if homes[k] != homes_without_b[k]]
    # rendezvous hashing: b's return moves only the keys that rank b first, to b
    assert moved and all(homes[k] == "http://b:1" for k in moved)


def test_affinity_respects_the_auto_limits():
    pool = EndpointPool(["http://a:1", "http://b:1"])
    a, b = pool.endpoints
    pool.set_limit(a, 2)
    pool.set_limit(b, 2)
    for _ in range(4):
        take(pool, "same")
    assert a.outstanding == 2 and b.outstanding == 2
    assert pool.choose("same") is None  # both at their limit


def test_a_query_in_a_base_url_stays_after_every_path_harvest_appends():
    from harvest.client.endpoints import endpoint_url

    base = normalize_url("http://h:8/v1/?api_key=K&x=1")
    assert base == "http://h:8?api_key=K&x=1"
    assert endpoint_url(base, "/v1/chat/completions") == "http://h:8/v1/chat/completions?api_key=K&x=1"
    assert endpoint_url(base, "/metrics?name=a") == "http://h:8/metrics?name=a&api_key=K&x=1"
    assert endpoint_url(normalize_url("http://h:8/v1"), "/health") == "http://h:8/health"


# --- not answering: max(HUNG_MIN_S, HUNG_P90_FACTOR x p90) -------------------------------------------


def test_the_hung_bound_is_three_times_the_p90_latency_above_its_30_s_floor():
    e = Endpoint("http://a:1")
    assert e.hung_after_s() == HUNG_MIN_S == 30.0  # no answer yet: the floor
    for _ in range(10):
        e.heard(0.0, 20.0)
    assert e.hung_after_s() == 60.0  # ten answers of 20 s: 3 x 20
    slow = Endpoint("http://b:1")
    for latency in [12.0] * 9 + [100.0]:  # one outlier above the p90 does not move it
        slow.heard(0.0, latency)
    assert slow.hung_after_s() == 36.0
    fast = Endpoint("http://c:1")
    for _ in range(50):
        fast.heard(0.0, 2.0)  # 3 x 2 s = 6 s: the floor holds
    assert fast.hung_after_s() == 30.0
    fast.heard(0.0)  # an answer without a latency (an error status) leaves the p90 as it was
    assert fast.hung_after_s() == 30.0


def test_an_endpoint_holding_requests_past_its_bound_counts_as_hung_until_it_answers():
    e = Endpoint("http://a:1")
    for _ in range(10):
        e.heard(0.0, 20.0)
    for _ in range(4):
        e.took(100.0)
    at_bound, past = e.stats(160.0), e.stats(161.0)
    assert (at_bound.quiet_s, at_bound.hung_after_s, at_bound.hung) == (60.0, 60.0, False)
    assert (past.quiet_s, past.outstanding, past.hung) == (61.0, 4, True)
    e.heard(150.0, 50.0)  # something came back: the quiet spell counts from it
    assert e.stats(161.0).quiet_s == 11.0 and not e.stats(161.0).hung
    idle = Endpoint("http://b:1")
    assert idle.stats(1000.0).quiet_s is None and not idle.stats(1000.0).hung  # nothing in flight


# ---------------------------------------------------------------------- requests on the wire (carry)

async def _carried(endpoint: Endpoint, started: asyncio.Event, **kw) -> str:
    async def request() -> str:
        started.set()
        await asyncio.Event().wait()  # an answer that never comes
        return "answer"
    return await endpoint.carry(request(), **kw)


async def test_carry_returns_the_answer_and_leaves_nothing_on_the_wire():
    endpoint = Endpoint("http://a:1")

    async def request() -> str:
        await asyncio.sleep(0)
        return "answer"

    assert await endpoint.carry(request()) == "answer"
    assert endpoint.wire == {} and endpoint.abandon() == 0


async def test_abandon_gives_up_the_waiting_requests_once_and_their_tasks_carry_on():
    endpoint = Endpoint("http://a:1")
    started = [asyncio.Event() for _ in range(3)]
    calls = [asyncio.create_task(_carried(endpoint, s)) for s in started]
    await asyncio.gather(*(s.wait() for s in started))
    assert endpoint.abandon() == 3 and endpoint.abandon() == 0  # each cancelled once
    for call in calls:
        with pytest.raises(Abandoned):
            await call
        assert not call.cancelled() and call.cancelling() == 0  # the task was not left cancelled
    assert endpoint.wire == {}


async def test_the_callers_own_cancellation_propagates_alone_and_with_an_abandonment():
    endpoint = Endpoint("http://a:1")
    started = [asyncio.Event(), asyncio.Event()]
    alone = asyncio.create_task(_carried(endpoint, started[0]))
    both = asyncio.create_task(_carried(endpoint, started[1]))
    await asyncio.gather(*(s.wait() for s in started))
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    both.cancel()  # the caller's cancellation and the endpoint given up before the task runs again
    assert endpoint.abandon() == 1
    with pytest.raises(asyncio.CancelledError):
        await both
    assert alone.cancelled() and both.cancelled() and endpoint.wire == {}


async def test_a_timeout_that_fires_with_an_abandonment_is_a_timeout():
    endpoint = Endpoint("http://a:1")
    started = asyncio.Event()
    scopes: list[asyncio.Timeout] = []

    async def within() -> str:
        async with asyncio.timeout(3600) as scope:
            scopes.append(scope)
            return await _carried(endpoint, started)

    call = asyncio.create_task(within())
    await started.wait()
    scopes[0].reschedule(asyncio.get_running_loop().time() - 1)  # due now: it cancels the task next
    assert endpoint.abandon() == 1
    with pytest.raises(TimeoutError):
        await call
    assert endpoint.wire == {}


async def test_without_a_cancellation_count_the_request_runs_apart_and_is_abandoned_the_same():
    """Python 3.10 has no Task.cancelling(): there each request waits in a task of its own."""
    endpoint = Endpoint("http://a:1")
    started = [asyncio.Event(), asyncio.Event()]

    async def apart(s: asyncio.Event) -> str:
        async def request() -> str:
            s.set()
            await asyncio.Event().wait()
            return "answer"
        return await endpoint._carry_apart(request())

    given_up, cancelled = (asyncio.create_task(apart(s)) for s in started)
    await asyncio.gather(*(s.wait() for s in started))
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert endpoint.abandon() == 1
    with pytest.raises(Abandoned):
        await given_up
    assert endpoint.wire == {}
