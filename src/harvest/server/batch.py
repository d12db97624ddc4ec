"""The batch limit of an engine harvest launches: how many requests it runs at once, when known.

``concurrency = "auto"`` starts there instead of climbing from a guess. Read from the
engines' own defaults:

- vLLM: ``--max-num-seqs`` (``max_running_requests``); unset, vLLM 0.32 picks 256 on a GPU under
  70 GiB and 1024 above it (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``), 128
  on its CPU build: 256 with GPUs (the smaller one; the gauges show more within a scrape), 128 without.
- SGLang: ``--max-running-requests``; unset, it sizes the batch from KV memory: unknown.
- llama.cpp: ``-np/--parallel`` slots; unset, 4 (what ``llama-server`` picks).
- transformers (``--continuous-batching``): ``max_requests_per_batch`` (no serve flag; 1024 in
  transformers 5.19's ``continuous_batching/initialization.py`` fallback).
- ``openai`` / ``command``: not launched with a known batch: unknown.
"""

from __future__ import annotations

from collections.abc import Sequence

from harvest.config import ServerConfig

#: Flags that set the batch limit, by engine kind (the last occurrence in ``extra_args`` wins; read
#: in any spelling the engine's parser reads as one, e.g. vLLM's ``--max-num-se 64``).
_FLAGS = {
    "vllm": ("--max-num-seqs",),
    "sglang": ("--max-running-requests",),
    "llamacpp": ("-np", "--parallel"),
}


def batch_limit(config: ServerConfig) -> int | None:
    """Requests ``config``'s engine runs at once, or None when harvest cannot know it."""
    engine = config.engine
    flagged = _flag_value(engine, config.extra_args, _FLAGS.get(engine, ()))
    if flagged is not None:
        return flagged
    if config.max_running_requests is not None and engine in ("vllm", "sglang", "llamacpp"):
        return config.max_running_requests
    if engine == "vllm":
        return 256 if config.gpus else 128
    if engine == "llamacpp":
        return 4
    if engine == "transformers":
        return 1024
    return None


def batch_limit_exact(config: ServerConfig) -> bool:
    """Whether :func:`batch_limit` is the engine's hard cap on requests running at once, not a guess:
    set by its flag or ``max_running_requests``, or a default that does not depend on the machine
    (vLLM's CPU build: 128; llama.cpp: 4 slots). vLLM's GPU default (256 or 1024 by GPU memory) and
    transformers' requests per batch (an upper bound that KV memory may lower) are not."""
    engine = config.engine
    if _flag_value(engine, config.extra_args, _FLAGS.get(engine, ())) is not None:
        return True
    if config.max_running_requests is not None and engine in ("vllm", "sglang", "llamacpp"):
        return True
    return (engine == "vllm" and not config.gpus) or engine == "llamacpp"


def has_metrics(config: ServerConfig) -> bool:
    """Whether the engine exports Prometheus /metrics (the controller then steers on its gauges)."""
    from harvest.server.base import adapter_for

    try:
        return adapter_for(config.engine).metrics.metrics_path is not None
    except KeyError:
        return False


def _flag_value(engine: str, argv: Sequence[str], flags: tuple[str, ...]) -> int | None:
    from harvest.engine_flags import readings

    value: int | None = None
    for i, reading in readings(engine, argv):
        if len(reading.candidates) != 1 or reading.candidates[0] not in flags:
            continue
        raw = reading.inline_value if reading.inline_value is not None else (argv[i + 1] if i + 1 < len(argv) else "")
        if raw.isdigit() and int(raw) > 0:
            value = int(raw)
    return value


__all__ = ["batch_limit", "batch_limit_exact", "has_metrics"]
