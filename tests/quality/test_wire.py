"""The probe wire: request bodies each engine needs, their answers read back, errors mapped by status.

The vLLM answers below are shaped as vLLM 0.32.0's CPU build answered on this project's tiny model
(the live path is exercised in tests/campaign/test_compare.py). SGLang's shapes follow its
documentation of ``/generate`` (``meta_info.input_token_logprobs`` and ``input_top_logprobs`` as
``[logprob, token_id, text]``); no SGLang server runs in these tests.
"""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import pytest

from harvest.transport import MockTransport, RawResponse, Unreachable
from harvest.config import ServerConfig
from harvest.errors import RequestError, ServerSick
from harvest.quality.probe import ProbePrompt
from tests.engines import not_http_peer
from harvest.quality.wire import (
    ChatWire,
    SGLangWire,
    VLLMWire,
    open_wire,
    parse_sglang_input_logprobs,
    parse_vllm_prompt_logprobs,
    protocol_for,
)

PROMPT = ProbePrompt("p1", (("user", "Hello there"),))

#: prompt [2, 80] then target tokens [300, 45]; k = 2. Position 2 (token 300) ranks 726: it is listed
#: beside the top-2.
VLLM_PROMPT_LOGPROBS = [
    None,
    {"80": {"logprob": -8.72, "rank": 3904, "decoded_token": "k"},
     "3454": {"logprob": -7.60, "rank": 1, "decoded_token": "ware"},
     "554": {"logprob": -7.61, "rank": 2, "decoded_token": "00"}},
    {"300": {"logprob": -8.13, "rank": 726, "decoded_token": " b"},
     "827": {"logprob": -7.61, "rank": 1, "decoded_token": " no"},
     "257": {"logprob": -7.63, "rank": 2, "decoded_token": ""}},
    {"45": {"logprob": -7.51, "rank": 1, "decoded_token": "H"},
     "1609": {"logprob": -7.59, "rank": 2, "decoded_token": "til"}},
]


def test_vllm_prompt_logprobs_are_read_per_target_position():
    scores = parse_vllm_prompt_logprobs(VLLM_PROMPT_LOGPROBS, 2, [300, 45], k=2)
    first, second = scores
    assert (first.token, first.logprob, first.top1) == (300, -8.13, 827)
    assert first.top == {827: -7.61, 257: -7.63}  # the actual token (rank 726) is not in the top-k
    assert (second.token, second.top1) == (45, 45)
    assert second.top == {45: -7.51, 1609: -7.59}
    with pytest.raises(ValueError):
        parse_vllm_prompt_logprobs(VLLM_PROMPT_LOGPROBS, 2, [300, 99], k=2)  # not the token that was scored


def test_sglang_input_logprobs_are_aligned_from_the_end_and_checked():
    token_lps = [[-1.0, 80, None], [-2.5, 300, None], [-0.5, 45, None]]
    top = [[[-0.9, 81, None]], [[-0.2, 301, None], [-2.5, 300, None]], [[-0.5, 45, None], [-1.5, 46, None]]]
    scores = parse_sglang_input_logprobs(token_lps, top, [300, 45])
    assert [(s.token, s.logprob, s.top1) for s in scores] == [(300, -2.5, 301), (45, -0.5, 45)]
    assert scores[0].top == {301: -0.2, 300: -2.5}
    with pytest.raises(ValueError):
        parse_sglang_input_logprobs(token_lps, top, [301, 45])
    with pytest.raises(ValueError):
        parse_sglang_input_logprobs(token_lps[:1], top[:1], [300, 45])


def _config(engine: str = "vllm") -> ServerConfig:
    return ServerConfig(engine=engine, model="m", served_model_name="tiny", port=8123)


def _answer(status: int, obj: object = None) -> RawResponse:
    return RawResponse(status, json.dumps(obj).encode() if obj is not None else b"")


def test_vllm_wire_sends_token_ids_and_reads_answers():
    seen: list[tuple[str, dict]] = []

    def handler(method, url, body, headers) -> RawResponse:
        body = json.loads(body)
        seen.append((urlsplit(url).path, body))
        if urlsplit(url).path == "/tokenize":
            return _answer(200, {"count": 2, "tokens": [2, 80]})
        if body.get("prompt_logprobs"):
            return _answer(200, {"choices": [{"text": "",
                                                          "prompt_logprobs": VLLM_PROMPT_LOGPROBS}]})
        return _answer(200, {"choices": [{"text": " b H", "token_ids": [300, 45],
                                                      "finish_reason": "length"}]})

    async def go():
        async with VLLMWire(_config(), transport=MockTransport(handler)) as wire:
            ids = await wire.tokenize([PROMPT])
            gen = await wire.generate(PROMPT, ids[0], 2)
            scores = await wire.score(ids[0], gen.token_ids, 2)
            return ids, gen, scores

    ids, gen, scores = asyncio.run(go())
    assert ids == [[2, 80]]
    assert gen.token_ids == (300, 45) and gen.text == " b H" and gen.finish_reason == "length"
    assert [s.top1 for s in scores] == [827, 45]
    tokenize, generate, score = seen
    assert tokenize[1]["messages"] == [{"role": "user", "content": "Hello there"}]
    assert tokenize[1]["add_generation_prompt"] is True and tokenize[1]["model"] == "tiny"
    assert generate[1]["prompt"] == [2, 80] and generate[1]["temperature"] == 0.0
    assert generate[1]["return_token_ids"] is True and generate[1]["max_tokens"] == 2
    assert score[1]["prompt"] == [2, 80, 300, 45] and score[1]["prompt_logprobs"] == 2
    assert score[1]["max_tokens"] == 1


def test_sglang_wire_builds_generate_requests():
    seen: list[dict] = []

    def handler(method, url, body, headers) -> RawResponse:
        body = json.loads(body)
        seen.append(body)
        assert urlsplit(url).path == "/generate"
        if body.get("top_logprobs_num"):
            return _answer(200, {"text": "", "meta_info": {
                "input_token_logprobs": [[-1.0, 80, None], [-2.5, 300, None], [-0.5, 45, None]],
                "input_top_logprobs": [[[-0.9, 81, None]], [[-0.2, 301, None]], [[-0.5, 45, None]]]}})
        return _answer(200, {"text": " b H", "output_ids": [300, 45],
                                         "meta_info": {"finish_reason": {"type": "length", "length": 2}}})

    async def go():
        async with SGLangWire(_config("sglang"), transport=MockTransport(handler)) as wire:
            gen = await wire.generate(PROMPT, [2, 80], 2)
            return gen, await wire.score([2, 80], gen.token_ids, 5)

    gen, scores = asyncio.run(go())
    assert gen.token_ids == (300, 45) and gen.finish_reason == "length"
    assert [s.logprob for s in scores] == [-2.5, -0.5]
    generate, score = seen
    assert generate["input_ids"] == [2, 80]
    assert generate["sampling_params"] == {"max_new_tokens": 2, "temperature": 0.0}
    assert score["input_ids"] == [2, 80, 300, 45] and score["return_logprob"] is True
    assert score["logprob_start_len"] == 1 and score["top_logprobs_num"] == 5


def test_chat_wire_has_no_token_ids_and_no_teacher_forcing():
    def handler(method, url, body, headers) -> RawResponse:
        assert urlsplit(url).path == "/v1/chat/completions"
        return _answer(200, {"choices": [{"message": {"content": "hi"},
                                                      "finish_reason": "stop"}]})

    async def go():
        async with ChatWire(_config("transformers"), transport=MockTransport(handler)) as wire:
            assert await wire.tokenize([PROMPT]) is None
            with pytest.raises(NotImplementedError):
                await wire.score([1], [2], 1)
            return await wire.generate(PROMPT, None, 4)

    gen = asyncio.run(go())
    assert gen.text == "hi" and gen.token_ids is None
    assert not ChatWire.teacher_forcing


@pytest.mark.parametrize(("status", "error"), [(400, RequestError), (404, RequestError), (500, ServerSick),
                                                (503, ServerSick)])
def test_errors_are_mapped_by_status(status, error):
    def handler(method, url, body, headers) -> RawResponse:
        return _answer(status, {"error": {"message": "nope"}})

    async def go():
        async with VLLMWire(_config(), transport=MockTransport(handler)) as wire:
            await wire.generate(PROMPT, [1, 2], 3)

    with pytest.raises(error):
        asyncio.run(go())


def test_connection_failure_is_the_server_being_sick():
    def handler(method, url, body, headers) -> RawResponse:
        raise Unreachable("ClientConnectorError: refused")

    async def go():
        async with VLLMWire(_config(), transport=MockTransport(handler)) as wire:
            await wire.generate(PROMPT, [1, 2], 3)

    with pytest.raises(ServerSick):
        asyncio.run(go())


def test_a_refused_port_on_loopback_is_the_server_being_sick():
    """The real aiohttp path: nothing listens on the port, the wire says which request failed."""
    with socket.socket() as sock:  # bound, never listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        cfg = ServerConfig(engine="vllm", model="m", port=sock.getsockname()[1])

        async def go():
            async with VLLMWire(cfg, timeout=5.0) as wire:
                await wire.generate(PROMPT, [1, 2], 3)

        with pytest.raises(ServerSick, match=r"POST /v1/completions: Unreachable: "):
            asyncio.run(go())


def test_an_answer_that_is_not_http_is_the_server_being_sick():
    with not_http_peer() as port:
        cfg = ServerConfig(engine="vllm", model="m", port=port)

        async def go():
            async with VLLMWire(cfg, timeout=10.0) as wire:
                await wire.generate(PROMPT, [1, 2], 3)

        with pytest.raises(ServerSick, match=r"POST /v1/completions: "):
            asyncio.run(go())


def test_the_wire_talks_to_a_loopback_server_with_its_key(monkeypatch):
    """A real aiohttp server on loopback: the body arrives as JSON with the bearer key, and a 4xx
    answer is this prompt's error, with the server's text."""
    from aiohttp import web

    monkeypatch.setenv("HARVEST_TEST_WIRE_KEY", "sk-test-key")
    seen: list[tuple[str, str | None, dict]] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.content_type, request.headers.get("Authorization"), body))
        if body["max_tokens"] > 100:
            return web.json_response({"error": "too long"}, status=400)
        return web.json_response({"choices": [{"text": "ok", "token_ids": [7], "finish_reason": "stop"}]})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        cfg = ServerConfig(engine="vllm", model="m", port=port, api_key_env="HARVEST_TEST_WIRE_KEY")
        try:
            async with VLLMWire(cfg, timeout=10.0) as wire:
                gen = await wire.generate(PROMPT, [1, 2], 3)
                with pytest.raises(RequestError, match="too long") as info:
                    await wire.generate(PROMPT, [1, 2], 500)
                return gen, info.value.status
        finally:
            await runner.cleanup()

    gen, status = asyncio.run(go())
    assert gen.text == "ok" and gen.token_ids == (7,) and status == 400
    assert seen[0][0] == "application/json" and seen[0][1] == "Bearer sk-test-key"
    assert seen[0][2]["prompt"] == [1, 2] and seen[0][2]["max_tokens"] == 3


def test_protocol_by_engine():
    assert protocol_for(_config("vllm")) == "vllm"
    assert protocol_for(_config("sglang")) == "sglang"
    assert protocol_for(_config("transformers")) == "chat"
    assert protocol_for(_config("vllm"), "chat") == "chat"

    async def go():
        async with open_wire(_config("llamacpp")) as wire:
            return wire

    assert isinstance(asyncio.run(go()), ChatWire)
