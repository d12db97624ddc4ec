"""The context check: where the limit is learned from, what is counted, when an item is skipped.

The server side is a fake ``side_request`` seam answering as vLLM, SGLang, llama.cpp and
``transformers serve`` do (their answers as read from their sources); the engine tests
(tests/campaign/test_run.py, tests/gpu/test_context_gpu.py) run the same check against real servers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from harvest.campaign.run.context import (
    MAX_BYTES_PER_TOKEN,
    TEMPLATE_MARGIN,
    ContextGuard,
    config_context,
)
from harvest.config import parse_config
from harvest.dataset import Item, Message


class FakeServer:
    """Answers ``side_request`` from a table of (method, path) -> (status, body) and records calls."""

    def __init__(self, answers: dict[tuple[str, str], Any], model: str | None = None):
        self.answers = answers
        self.calls: list[tuple[str, str, Any]] = []
        self.model = model

    async def side_request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None):
        self.calls.append((method, path, body))
        answer = self.answers.get((method, path), (404, {"detail": "Not Found"}))
        return answer(body) if callable(answer) else answer


def guard(tmp_path: Path, engine: str = "vllm", model: str | None = None, **data: Any) -> ContextGuard:
    server: dict[str, Any] = {"engine": engine}
    if engine == "openai":
        server["base_url"] = "http://127.0.0.1:9"
    else:
        server["model"] = model or str(tmp_path / "no-such-model")
    cfg = parse_config({"server": server, "data": {"path": "x.jsonl", **data}, "sampling": {"max_tokens": 100}})
    return ContextGuard(cfg)


def item(*turns: tuple[str, str]) -> Item:
    return Item("i", "x.jsonl", 1, tuple(Message(r, c) for r, c in turns))  # type: ignore[arg-type]


def run(coro):
    return asyncio.run(coro)


def test_config_json_context_keys_rope_scaling_and_text_config(tmp_path):
    def write(cfg: dict[str, Any]) -> Path:
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    assert config_context(write({"max_position_embeddings": 2048})) == 2048
    assert config_context(write({"n_positions": 1024, "max_position_embeddings": 4096})) == 1024
    assert config_context(write({"text_config": {"max_position_embeddings": 8192}})) == 8192
    assert config_context(write({"max_position_embeddings": 4096,
                                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 4096}})) == 16384
    assert config_context(write({"max_position_embeddings": 4096,
                                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})) == 4096
    assert config_context(write({"hidden_size": 64})) is None
    assert config_context(tmp_path / "missing") is None


def test_vllm_limit_from_v1_models_and_exact_count_with_the_chat_template(tmp_path):
    server = FakeServer({
        ("GET", "/v1/models"): (200, {"data": [{"id": "m", "max_model_len": 2048}]}),
        ("POST", "/tokenize"): lambda body: (200, {"count": 5000, "max_model_len": 2048, "tokens": [1] * 5000}),
    })
    g = guard(tmp_path)
    assert run(g.check(server, item(("user", "short question")))) is None
    assert [c[1] for c in server.calls] == ["/v1/models"]  # a short prompt costs no /tokenize
    reason = run(g.check(server, item(("system", "s"), ("user", "word " * 2000))))
    assert reason == ("prompt of 5000 tokens (counted with the chat template) + max_tokens 100 does not fit "
                      "the model's context of 2048 tokens (max_model_len on /v1/models)")
    sent = server.calls[-1]
    assert sent[:2] == ("POST", "/tokenize") and sent[2]["messages"][-1]["role"] == "user"
    assert sent[2]["add_generation_prompt"] is True


def test_a_prompt_that_fits_after_counting_is_sent(tmp_path):
    server = FakeServer({("GET", "/v1/models"): (200, {"data": [{"id": "m", "max_model_len": 4096}]}),
                         ("POST", "/tokenize"): (200, {"count": 3000, "tokens": []})})
    big = "x" * 5000  # more bytes than the limit allows uncounted, fewer tokens than the limit
    assert run(guard(tmp_path).check(server, item(("user", big)))) is None
    assert server.calls[-1][1] == "/tokenize"


def test_sglang_limit_from_server_info_and_text_tokenize(tmp_path):
    server = FakeServer({
        ("GET", "/v1/models"): (200, {"data": [{"id": "m"}]}),
        ("GET", "/server_info"): (200, {"context_length": None, "max_req_input_len": 1000}),
        ("POST", "/tokenize"): lambda body: ((200, {"tokens": [1] * 1200, "count": 1200})
                                            if "prompt" in body else (400, {"message": "bad"})),
    })
    reason = run(guard(tmp_path, "sglang").check(server, item(("user", "y" * 4000))))
    assert "prompt of 1200 tokens (texts counted by /tokenize)" in reason
    assert "context of 1000 tokens (max_req_input_len on /server_info)" in reason


def test_sglang_get_server_info_fallback(tmp_path):
    server = FakeServer({("GET", "/get_server_info"): (200, {"context_length": 512})})
    limit = run(guard(tmp_path, "sglang").learn(server))
    assert (limit.tokens, limit.source) == (512, "context_length on /get_server_info")


def test_llamacpp_n_ctx_per_slot_and_content_tokenize(tmp_path):
    server = FakeServer({
        ("GET", "/props"): (200, {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 8}),
        ("POST", "/tokenize"): lambda body: (200, {"tokens": [7] * len(body.get("content", "").split())}),
    })
    reason = run(guard(tmp_path, "llamacpp").check(server, item(("user", "tok " * 3000))))
    assert "prompt of 3000 tokens" in reason and "context of 2048 tokens (n_ctx per slot on /props)" in reason


def test_transformers_serve_reports_nothing_so_the_model_folder_config_counts(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    server = FakeServer({("GET", "/v1/models"): (200, {"object": "list", "data": []})})
    g = guard(tmp_path, "transformers", model=str(model))
    huge = "z" * 800_000  # the 800 KB prompt of the issue
    reason = run(g.check(server, item(("user", huge))))
    assert reason == (f"prompt of {800_000 // MAX_BYTES_PER_TOKEN} tokens (at least, from 800000 bytes) + "
                      "max_tokens 100 does not fit the model's context of 2048 tokens (tiny-llama/config.json)")
    assert all(c[1] != "/tokenize" for c in server.calls)  # transformers serve has none
    # Near the limit, the character bound is a lower bound: such a prompt is still sent.
    assert run(g.check(server, item(("user", "z" * 20_000)))) is None


def test_no_tokenizer_endpoint_falls_back_to_the_character_bound_once(tmp_path):
    server = FakeServer({("GET", "/v1/models"): (200, {"data": [{"id": "m", "max_model_len": 1024}]})})
    g = guard(tmp_path, "openai")
    first = run(g.check(server, item(("user", "a" * 40_000))))
    second = run(g.check(server, item(("user", "b" * 40_000))))
    assert first is not None and "at least, from 40000 bytes" in first and second is not None
    assert sum(1 for c in server.calls if c[1] == "/tokenize") == 1  # a 404 is remembered


def test_unknown_context_checks_only_max_prompt_tokens(tmp_path):
    server = FakeServer({})
    g = guard(tmp_path, "openai")
    assert run(g.check(server, item(("user", "q" * 100_000)))) is None
    assert g.limit is not None and g.limit.tokens is None
    capped = guard(tmp_path, "openai", max_prompt_tokens=500)
    reason = run(capped.check(FakeServer({}), item(("user", "q" * 100_000))))
    assert reason == f"prompt of {100_000 // MAX_BYTES_PER_TOKEN} tokens (at least, from 100000 bytes) is over " \
                     "[data] max_prompt_tokens = 500"
    assert run(capped.check(FakeServer({}), item(("user", "q" * (500 - TEMPLATE_MARGIN - 16))))) is None


def test_multi_turn_counts_the_last_turns_known_prompt(tmp_path):
    seen: list[Any] = []

    def tokenize(body):
        seen.append(body)
        return 200, {"count": 10, "tokens": []}

    server = FakeServer({("GET", "/v1/models"): (200, {"data": [{"id": "m", "max_model_len": 300}]}),
                         ("POST", "/tokenize"): tokenize})
    it = item(("system", "sys"), ("user", "u1" * 100), ("assistant", "old" * 500), ("user", "u2" * 100))
    run(guard(tmp_path).check(server, it))
    # Regenerated history: the old answers are not part of what is known; the user turns are.
    assert seen[-1]["messages"] == [{"role": "system", "content": "sys"},
                                    {"role": "user", "content": "u1" * 100 + "\n" + "u2" * 100}]
    run(_original(tmp_path).check(server, it))
    assert [m["role"] for m in seen[-1]["messages"]] == ["system", "user", "assistant", "user"]


def _original(tmp_path: Path) -> ContextGuard:
    cfg = parse_config({"server": {"engine": "vllm", "model": str(tmp_path / "m")}, "data": {"path": "x.jsonl"},
                        "sampling": {"max_tokens": 100}, "run": {"history": "original"}})
    return ContextGuard(cfg)


def test_max_prompt_tokens_is_validated():
    with pytest.raises(Exception, match="max_prompt_tokens"):
        parse_config({"data": {"path": "x.jsonl", "max_prompt_tokens": 0}})


@pytest.mark.engine
def test_real_llama_server_context_per_slot_and_tokenize(tmp_path, llama_server):
    """llama-server with -c 16384 -np 8: 2048 tokens per slot from /props; /tokenize counts texts."""
    from harvest.client import Client

    cfg = parse_config({"server": {"engine": "openai", "base_url": llama_server.url},
                        "data": {"path": "x.jsonl"}, "sampling": {"max_tokens": 64}})
    g = ContextGuard(cfg)

    async def go():
        async with Client.from_config(cfg) as client:
            limit = await g.learn(client)
            short = await g.check(client, item(("user", "What is a binary search?")))
            huge = await g.check(client, item(("user", "lorem ipsum dolor " * 20_000)))
            return limit, short, huge

    limit, short, huge = run(go())
    assert (limit.tokens, limit.source) == (2048, "n_ctx per slot on /props")
    assert short is None
    assert "(texts counted by /tokenize) + max_tokens 64 does not fit the model's context of 2048" in huge
    assert int(huge.split()[2]) > 2048


def test_max_tokens_that_leaves_no_room_is_a_config_error_not_a_skip(tmp_path):
    from harvest.errors import ConfigError

    server = FakeServer({("GET", "/v1/models"): (200, {"data": [{"id": "m", "max_model_len": 100}]})})
    g = guard(tmp_path)  # max_tokens 100
    with pytest.raises(ConfigError, match=r"\[sampling\] max_tokens: 100 leaves no room for any prompt in the "
                                          r"model's context of 100 tokens \(max_model_len on /v1/models\)"):
        run(g.check(server, item(("user", "hi"))))
    with pytest.raises(ConfigError):  # and again for every later item: none is skipped
        run(g.check(server, item(("user", "hello"))))
