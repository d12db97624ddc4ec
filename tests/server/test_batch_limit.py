"""The batch limit harvest knows of an engine it launches (server/batch.py): where auto starts."""

from __future__ import annotations

import pytest

from harvest.client.autoconc import start_for
from harvest.config import ServerConfig
from harvest.server.batch import batch_limit, batch_limit_exact, has_metrics


def cfg(engine: str, **fields) -> ServerConfig:
    return ServerConfig(engine=engine, model="/m", **fields)


@pytest.mark.parametrize(("config", "limit"), [
    (cfg("vllm"), 128),  # vLLM's CPU build default
    (cfg("vllm", gpus=[0]), 256),
    (cfg("vllm", max_running_requests=48), 48),
    (cfg("vllm", extra_args=["--max-num-seqs", "300"]), 300),
    (cfg("vllm", extra_args=["--max-num-seqs=64"], max_running_requests=8), 64),  # the flag is what runs
    (cfg("sglang"), None),
    (cfg("sglang", max_running_requests=200), 200),
    (cfg("llamacpp"), 4),
    (cfg("llamacpp", extra_args=["-np", "16"]), 16),
    # read as the engine's parser reads it: a prefix (vLLM, SGLang), '_' for '-' (vLLM, llama.cpp)
    (cfg("vllm", extra_args=["--max-num-se", "96"]), 96),
    (cfg("vllm", extra_args=["--max_num_seqs=72"]), 72),
    (cfg("sglang", extra_args=["--max-running=24"]), 24),
    (cfg("llamacpp", extra_args=["--parallel", "6"]), 6),
    (cfg("llamacpp", extra_args=["--parallel=6"]), 4),  # llama-server takes no --flag=value
    (cfg("transformers"), 1024),
])
def test_batch_limit_by_engine_and_flags(config, limit):
    assert batch_limit(config) == limit


@pytest.mark.parametrize(("config", "exact"), [
    (cfg("vllm"), True),  # the CPU build's 128 does not depend on the machine
    (cfg("vllm", gpus=[0]), False),  # 256 or 1024 by GPU memory: a guess
    (cfg("vllm", gpus=[0], extra_args=["--max-num-seqs", "300"]), True),
    (cfg("sglang"), False),
    (cfg("sglang", max_running_requests=200), True),
    (cfg("llamacpp"), True),
    (cfg("transformers"), False),  # requests per batch is an upper bound KV memory may lower
])
def test_which_limits_are_the_engines_hard_cap(config, exact):
    assert batch_limit_exact(config) is exact


def test_a_client_caps_auto_at_the_limit_only_when_every_endpoint_is_the_launched_engine():
    from harvest.campaign.run import engine_limit
    from harvest.client import Client
    from harvest.config import HarvestConfig

    def settings(endpoints: list[str]):
        config = HarvestConfig.model_validate({
            "server": {"engine": "vllm", "model": "/m"}, "client": {"endpoints": endpoints},
            "data": {"path": "in.jsonl"}})
        return Client.from_config(config, engine=engine_limit(config.server))._steer.settings

    assert settings([]).engine_limit == 128
    assert settings(["http://127.0.0.1:9/v1"]).engine_limit is None  # another engine, another cap


def test_auto_starts_at_the_limit_with_metrics_or_without():
    """Without /metrics too: on an H100 transformers' 1024 made x1.21 the tok/s of 512, and a start at
    half held 512 for the whole of a short run (BENCHMARKS.md, P7 A1)."""
    assert has_metrics(cfg("vllm")) and not has_metrics(cfg("transformers"))
    assert start_for(256, metrics=True, max_concurrency=1024) == 256
    assert start_for(1024, metrics=False, max_concurrency=1024) == 1024
    assert start_for(None, metrics=True, max_concurrency=1024) == 64
    assert start_for(4096, metrics=True, max_concurrency=1024) == 1024
    # A cap known exactly (vLLM CPU's 128) starts at it and a short queue; without /metrics (at the
    # cap itself), or above max_concurrency, it does not.
    assert start_for(128, metrics=True, max_concurrency=1024, exact=True) == 144
    assert start_for(4, metrics=True, max_concurrency=1024, exact=True) == 6
    assert start_for(128, metrics=False, max_concurrency=1024, exact=True) == 128
    assert start_for(128, metrics=True, max_concurrency=140, exact=True) == 140
