"""The client's request path against a scripted fake server: parsing, retries, sickness, balancing."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from harvest.client import (
    Client,
    EndpointState,
    Interrupted,
    MockTransport,
    RawResponse,
    RetryPolicy,
    Unreachable,
)
from harvest.config import ClientConfig, SamplingConfig, parse_config
from harvest.errors import ConfigError, RequestError, ServerSick
from tests.client.fakes import FakeServer, FakeTime, chat_response, error_response

A = "http://a.test:8000"
B = "http://b.test:8000"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello"}]


def make_client(server: FakeServer, time_: FakeTime, endpoints=(A,), *, retries: int = 3,
                deadline: float = 60.0, concurrency: int = 8, sick_after: int = 3, **kwargs) -> Client:
    config = ClientConfig(concurrency=concurrency, max_retries=retries, health_deadline=deadline, request_timeout=5)
    kwargs.setdefault("model", "m")
    return Client(list(endpoints), config, kwargs.pop("sampling", SamplingConfig(max_tokens=32)),
                  transport=MockTransport(server.handler), retry=RetryPolicy(sick_after=sick_after),
                  clock=time_.clock, sleep=time_.sleep, **kwargs)


# ----------------------------------------------------------------------------- success path

async def test_chat_parses_text_reasoning_usage_and_logprobs(fake_server: FakeServer, fake_time: FakeTime):
    body = {
        "model": "m", "prompt_logprobs": [None, {"5": {"logprob": -0.1}}],
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "answer", "reasoning_content": "thinking"},
                     "logprobs": {"content": [{"token": "answer", "logprob": -0.5, "top_logprobs": []}]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 32},
    }
    fake_server.script("POST", CHAT, RawResponse(200, json.dumps(body).encode()))
    async with make_client(fake_server, fake_time) as client:
        done = await client.chat(MSG, logprobs=True, top_logprobs=1, extra_body={"prompt_logprobs": 1})
    assert (done.text, done.reasoning_content, done.finish_reason) == ("answer", "thinking", "length")
    assert done.truncated
    assert (done.prompt_tokens, done.completion_tokens, done.attempts) == (11, 32, 1)
    assert done.endpoint == A and done.latency_s >= 0
    assert done.logprobs["content"][0]["logprob"] == -0.5
    assert done.prompt_logprobs == [None, {"5": {"logprob": -0.1}}]


async def test_reasoning_field_of_newer_vllm_is_read_and_absent_reasoning_is_none(fake_server, fake_time):
    fake_server.script("POST", CHAT, chat_response("a", reasoning="r1"), chat_response("b"))
    async with make_client(fake_server, fake_time) as client:
        first = await client.chat(MSG)
        second = await client.chat(MSG)
    assert first.reasoning_content == "r1"
    assert second.reasoning_content is None and second.text == "b"


async def test_body_carries_sampling_then_overrides_then_extra_body(fake_server, fake_time):
    sampling = SamplingConfig(max_tokens=7, temperature=0.5, top_p=0.9, top_k=20, seed=3, stop=["</s>"],
                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    async with make_client(fake_server, fake_time, sampling=sampling, api_key="k-123") as client:
        await client.chat(MSG, max_tokens=3, top_k=None, logprobs=True, top_logprobs=2,
                          extra_body={"prompt_logprobs": 1})
    (body,) = fake_server.bodies(CHAT)
    assert body == {"model": "m", "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": ["</s>"],
                    "chat_template_kwargs": {"enable_thinking": False}, "messages": MSG, "logprobs": True,
                    "top_logprobs": 2, "prompt_logprobs": 1}
    headers = fake_server.seen[-1][4]
    assert headers["Authorization"] == "Bearer k-123"


async def test_text_completion_posts_prompt_to_completions(fake_server, fake_time):
    reply = {"model": "m", "choices": [{"index": 0, "text": " world", "finish_reason": "stop",
                                        "prompt_logprobs": [None, {"1": -0.2}]}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    fake_server.script("POST", "/v1/completions", RawResponse(200, json.dumps(reply).encode()))
    async with make_client(fake_server, fake_time) as client:
        done = await client.complete("hello", max_tokens=1)
    assert (done.text, done.reasoning_content, done.prompt_logprobs) == (" world", None, [None, {"1": -0.2}])
    assert fake_server.bodies("/v1/completions")[0]["prompt"] == "hello"


async def test_model_name_is_discovered_from_v1_models_once(fake_server, fake_time):
    async with make_client(fake_server, fake_time, model=None) as client:
        await asyncio.gather(*(client.chat(MSG) for _ in range(5)))
        assert client.model == "served-model"
    assert {b["model"] for b in fake_server.bodies(CHAT)} == {"served-model"}
    assert fake_server.count("GET", "/v1/models") == 1


async def test_unencodable_text_is_the_items_fault_and_nothing_is_sent(fake_server, fake_time):
    async with make_client(fake_server, fake_time) as client:
        with pytest.raises(RequestError, match="not valid Unicode"):
            await client.chat([{"role": "user", "content": "bad \ud800 surrogate"}])
    assert fake_server.count("POST", CHAT) == 0


# ----------------------------------------------------------------------------- item failures

async def test_4xx_raises_request_error_with_server_message_and_no_retry(fake_server, fake_time):
    fake_server.script("POST", CHAT, error_response(400, "prompt is longer than the context (9000 > 8192)"))
    async with make_client(fake_server, fake_time) as client:
        with pytest.raises(RequestError) as caught:
            await client.chat(MSG)
        assert client.stats().errors == {"rejected": 1}
    assert caught.value.status == 400
    assert "9000 > 8192" in str(caught.value)
    assert fake_server.count("POST", CHAT) == 1


async def test_retry_after_is_honoured_and_the_retry_is_charged(fake_server, fake_time):
    fake_server.script("POST", CHAT, error_response(429, "slow down", retry_after="7"), chat_response("ok"))
    async with make_client(fake_server, fake_time) as client:
        done = await client.chat(MSG)
        stats = client.stats()
    assert done.text == "ok" and done.attempts == 2
    assert fake_time.sleeps == [7.0]
    assert stats.retries == 1 and stats.errors == {"busy": 1}


async def test_busy_forever_fails_the_item_after_max_retries_with_growing_backoff(fake_server, fake_time):
    fake_server.script("POST", CHAT, error_response(429))  # no Retry-After
    async with make_client(fake_server, fake_time, retries=3) as client:
        with pytest.raises(RequestError) as caught:
            await client.chat(MSG)
    assert caught.value.status == 429 and "after 4 attempts" in str(caught.value)
    assert fake_server.count("POST", CHAT) == 4
    # equal jitter: retry n waits within [c/2, c] for c = 0.5 * 2**(n-1)
    for n, delay in enumerate(fake_time.sleeps, start=1):
        ceiling = 0.5 * 2 ** (n - 1)
        assert ceiling / 2 <= delay <= ceiling
    assert len(fake_time.sleeps) == 3


async def test_5xx_on_a_healthy_server_is_charged_and_retried(fake_server, fake_time):
    fake_server.script("POST", CHAT, error_response(500, "CUDA error on this prompt"), chat_response("ok"))
    async with make_client(fake_server, fake_time) as client:
        done = await client.chat(MSG)
    assert done.attempts == 2
    assert fake_server.count("GET", "/health") == 1  # the failure was checked against health


async def test_5xx_on_a_healthy_server_exhausts_into_request_error(fake_server, fake_time):
    fake_server.script("POST", CHAT, error_response(500, "poison prompt"), error_response(500, "poison prompt"),
                       chat_response("other items work"))
    async with make_client(fake_server, fake_time, retries=1) as client:
        with pytest.raises(RequestError) as caught:
            await client.chat(MSG)
        assert (await client.chat(MSG)).text == "other items work"
    assert caught.value.status == 500 and "poison prompt" in str(caught.value)


async def test_malformed_2xx_is_retried_then_fails_the_item(fake_server, fake_time):
    fake_server.script("POST", CHAT, RawResponse(200, b"<html>proxy page</html>"))
    async with make_client(fake_server, fake_time, retries=1) as client:
        with pytest.raises(RequestError) as caught:
            await client.chat(MSG)
        assert client.stats().errors == {"bad_response": 2}
    assert caught.value.status == 200


async def test_timeout_on_a_healthy_server_is_charged(fake_server, fake_time):
    async def slow(base: str) -> RawResponse:
        await asyncio.sleep(30)
        return chat_response()

    fake_server.routes[("POST", CHAT)] = slow
    async with make_client(fake_server, fake_time, retries=0) as client:
        with pytest.raises(RequestError, match="no complete response within 0.05 s"):
            await client.chat(MSG, timeout=0.05)
        assert client.stats().errors == {"timeout": 1}
        assert client.stats().endpoints[0].state is EndpointState.HEALTHY


# ----------------------------------------------------------------------------- sick server

async def test_refused_connection_holds_the_request_without_charging_it(fake_server, fake_time):
    refused = Unreachable("ClientConnectorError: Connect call failed")
    fake_server.script("POST", CHAT, refused, chat_response("after restart"))
    fake_server.script("GET", "/health", refused, refused, RawResponse(200, b""))
    async with make_client(fake_server, fake_time, retries=0) as client:
        done = await client.chat(MSG)
        stats = client.stats()
    assert done.text == "after restart" and done.attempts == 1
    assert stats.retries == 0 and stats.errors == {"unreachable": 1}
    assert stats.endpoints[0].state is EndpointState.HEALTHY and stats.endpoints[0].consecutive_failures == 0
    assert fake_time.sleeps[:3] == [0.5, 1.0, 2.0]  # health polls back off


async def test_connection_lost_with_failing_health_is_not_charged(fake_server, fake_time):
    fake_server.script("POST", CHAT, Interrupted("ServerDisconnectedError"), chat_response("ok"))
    fake_server.script("GET", "/health", RawResponse(503, b""), RawResponse(200, b""))
    async with make_client(fake_server, fake_time, retries=0) as client:
        done = await client.chat(MSG)
    assert done.attempts == 1 and done.text == "ok"


async def test_health_falls_back_to_v1_models_where_there_is_no_health(fake_server, fake_time):
    fake_server.script("POST", CHAT, Unreachable("refused"), chat_response("ok"))
    fake_server.script("GET", "/health", RawResponse(404, b""))
    fake_server.script("GET", "/v1/models", RawResponse(200, b'{"data": []}'))
    async with make_client(fake_server, fake_time, retries=0) as client:
        assert (await client.chat(MSG)).text == "ok"
    assert fake_server.count("GET", "/v1/models") >= 1


async def test_health_deadline_passed_raises_server_sick_and_check_health_revives(fake_server, fake_time):
    fake_server.script("POST", CHAT, Unreachable("refused"))
    fake_server.script("GET", "/health", Unreachable("refused"))
    async with make_client(fake_server, fake_time, deadline=30.0) as client:
        start = fake_time.now
        with pytest.raises(ServerSick) as caught:
            await client.chat(MSG)
        assert fake_time.now - start >= 30.0
        assert caught.value.endpoint == A and "refused" in str(caught.value)
        assert client.stats().endpoints[0].state is EndpointState.DOWN
        sent = fake_server.count("POST", CHAT)
        with pytest.raises(ServerSick):
            await client.chat(MSG)  # all endpoints down: fails at once, nothing sent
        assert fake_server.count("POST", CHAT) == sent

        fake_server.script("GET", "/health", RawResponse(200, b""))
        fake_server.script("POST", CHAT, chat_response("back"))
        assert await client.check_health() == {A: True}
        assert (await client.chat(MSG)).text == "back"


async def test_5xx_run_with_health_ok_ends_in_server_sick_not_item_failures(fake_server, fake_time):
    fake_server.script("POST", CHAT, error_response(500, "engine broken"))
    async with make_client(fake_server, fake_time, retries=10, sick_after=3, deadline=20.0) as client:
        with pytest.raises(ServerSick) as caught:
            await client.chat(MSG)
    assert caught.value.status == 500 and "engine broken" in str(caught.value)


async def test_many_requests_in_flight_when_the_server_dies_are_held_not_charged(fake_server, fake_time):
    alive = asyncio.Event()
    gate = asyncio.Event()
    calls = {"n": 0}

    async def chat(base: str) -> RawResponse:
        calls["n"] += 1
        if not alive.is_set():
            await gate.wait()
            raise Interrupted("ServerDisconnectedError")
        return chat_response("ok")

    def health(base: str) -> RawResponse:
        if alive.is_set():
            return RawResponse(200, b"")
        raise Unreachable("refused")

    fake_server.routes[("POST", CHAT)] = chat
    fake_server.routes[("GET", "/health")] = health
    async with make_client(fake_server, fake_time, retries=0, concurrency=16) as client:
        tasks = [asyncio.create_task(client.chat(MSG)) for _ in range(16)]
        while calls["n"] < 16:
            await asyncio.sleep(0)
        gate.set()  # the server dies under all sixteen
        while client.stats().held < 16:
            await asyncio.sleep(0)
        alive.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert [r.attempts for r in results] == [1] * 16


async def test_a_prompt_that_crashes_the_server_each_time_fails_after_max_outages(fake_server, fake_time):
    state = {"down": False, "crashes": 0}

    def chat(base: str) -> RawResponse:
        body = fake_server.seen[-1][3]
        if body["messages"][0]["content"] == "poison":
            state["down"] = True
            state["crashes"] += 1
            raise Interrupted("ServerDisconnectedError")
        return chat_response("fine")

    def health(base: str) -> RawResponse:
        if state["down"]:
            state["down"] = False  # the supervisor restarts it; the next probe finds it up
            raise Unreachable("refused")
        return RawResponse(200, b"")

    fake_server.routes[("POST", CHAT)] = chat
    fake_server.routes[("GET", "/health")] = health
    async with make_client(fake_server, fake_time, retries=5) as client:
        with pytest.raises(RequestError, match="suspected of crashing it"):
            await client.chat([{"role": "user", "content": "poison"}])
        innocent = await client.chat(MSG)
    assert state["crashes"] == 3  # RetryPolicy.max_outages
    assert innocent.text == "fine" and innocent.attempts == 1


# ----------------------------------------------------------------------------- several endpoints

async def test_least_outstanding_endpoint_gets_the_next_request(fake_server, fake_time):
    release = asyncio.Event()

    async def chat(base: str) -> RawResponse:
        if base == A and not release.is_set():
            await release.wait()
        return chat_response(base)

    fake_server.routes[("POST", CHAT)] = chat
    async with make_client(fake_server, fake_time, endpoints=(A, B)) as client:
        tasks = [asyncio.create_task(client.chat(MSG)) for _ in range(2)]
        while client.stats().completed < 1:
            await asyncio.sleep(0)
        assert {e.url: e.outstanding for e in client.stats().endpoints} == {A: 1, B: 0}
        # A is busy with one request: the next five all go to B
        answers = [await client.chat(MSG) for _ in range(5)]
        assert {a.endpoint for a in answers} == {B}
        release.set()
        await asyncio.gather(*tasks)


async def test_concurrent_requests_spread_evenly(fake_server, fake_time):
    release = asyncio.Event()

    async def chat(base: str) -> RawResponse:
        await release.wait()
        return chat_response(base)

    fake_server.routes[("POST", CHAT)] = chat
    async with make_client(fake_server, fake_time, endpoints=(A, B), concurrency=6) as client:
        tasks = [asyncio.create_task(client.chat(MSG)) for _ in range(10)]
        while client.stats().in_flight < 6:
            await asyncio.sleep(0)
        stats = client.stats()
        assert stats.in_flight == 6  # the concurrency limit holds the other four back
        assert [e.outstanding for e in stats.endpoints] == [3, 3]
        release.set()
        results = await asyncio.gather(*tasks)
    assert sorted(r.endpoint for r in results).count(A) == 5


async def test_sick_endpoint_leaves_rotation_and_returns_when_healthy(fake_server, fake_time):
    a_up = {"value": False}

    def chat(base: str) -> RawResponse:
        if base == A and not a_up["value"]:
            raise Unreachable("refused")
        return chat_response(base)

    def health(base: str) -> RawResponse:
        if base == A and not a_up["value"]:
            raise Unreachable("refused")
        return RawResponse(200, b"")

    fake_server.routes[("POST", CHAT)] = chat
    fake_server.routes[("GET", "/health")] = health
    # The fake clock leaps with every health poll: a deadline it cannot pass while B answers.
    async with make_client(fake_server, fake_time, endpoints=(A, B), retries=0, deadline=3600) as client:
        first = [await client.chat(MSG) for _ in range(6)]
        assert {r.endpoint for r in first} == {B}
        assert client.stats().endpoints[0].state is EndpointState.SICK
        assert fake_server.count("POST", CHAT, A) == 1  # tried once, then out of rotation
        a_up["value"] = True
        while client.stats().endpoints[0].state is not EndpointState.HEALTHY:
            await asyncio.sleep(0)
        later = await asyncio.gather(*(client.chat(MSG) for _ in range(6)))
    assert {r.endpoint for r in later} == {A, B}
    assert all(r.attempts == 1 for r in first + list(later))


# ----------------------------------------------------------------------------- secrets and config

async def test_api_key_never_reaches_exceptions_or_logs(fake_server, fake_time, caplog):
    secret = "sk-live-0123456789abcdef"
    caplog.set_level(logging.DEBUG)
    fake_server.script("POST", CHAT, error_response(401, f"Incorrect API key provided: {secret}"))
    async with make_client(fake_server, fake_time, api_key=secret, deadline=5.0) as client:
        with pytest.raises(RequestError) as rejected:
            await client.chat(MSG)
        fake_server.script("POST", CHAT, error_response(502, f"upstream said {secret}"))
        fake_server.script("GET", "/health", Unreachable(f"refused while sending {secret}"))
        with pytest.raises(ServerSick) as sick:
            await client.chat(MSG)
        texts = [str(rejected.value), repr(rejected.value), str(sick.value), repr(sick.value), repr(client),
                 repr(client.stats()), caplog.text]
    assert "Incorrect API key provided: ***" in str(rejected.value)
    assert "upstream said ***" in str(sick.value)
    assert caplog.records, "the sick/down transitions should have been logged"
    for text in texts:
        assert secret not in text


async def test_from_config_uses_server_url_extra_endpoints_and_key_from_env(monkeypatch, fake_server):
    monkeypatch.setenv("HARVEST_TEST_KEY", "sk-from-env")
    cfg = parse_config({
        "server": {"engine": "openai", "base_url": "http://10.0.0.5:30000/v1", "api_key_env": "HARVEST_TEST_KEY",
                   "served_model_name": "qwen"},
        "client": {"endpoints": ["http://10.0.0.6:30000"], "concurrency": 4},
    })
    async with Client.from_config(cfg, transport=MockTransport(fake_server.handler)) as client:
        assert client.endpoints == ("http://10.0.0.5:30000", "http://10.0.0.6:30000")
        assert client.config.concurrency == 4
        await client.chat(MSG)
        assert "sk-from-env" not in repr(client)
    method, base, path, body, headers = fake_server.seen[-1]
    assert body["model"] == "qwen"
    assert headers["Authorization"] == "Bearer sk-from-env"


@pytest.mark.parametrize("bad", [[], ["localhost:8000"], ["ftp://x"], ["http://a:1", "http://a:1/v1"]])
def test_bad_endpoint_lists_are_config_errors(bad):
    with pytest.raises(ConfigError):
        Client(bad)
