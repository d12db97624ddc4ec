"""llama.cpp's ``llama-server``.

Read from llama.cpp build 11434 (``tools/server/README.md``, ``tools/server/server.cpp``,
``src/llama-context.cpp``): ``-m MODEL --host --port --metrics``, ``-np/--parallel`` slots (here
from ``max_running_requests``), ``-a/--alias`` served name, ``--cache-type-k/-v`` KV dtype,
``-ngl all`` when GPUs are given. ``GET /health`` answers 503 while loading, 200 when ready. The
KV capacity comes from the line ``n_slots = S, n_ctx_slot = C, kv_unified = 'U'``: with a unified
KV cache (what ``llama-server`` picks without ``--parallel``: 4 slots sharing one cache, each slot's
``n_ctx_slot`` the whole context) it is C, else S x C; or ``llama_context: n_ctx = N``; else
``GET /props`` (``default_generation_settings.n_ctx``, times ``total_slots`` only when
``--parallel`` was given, i.e. the cache is split). With more requests in flight than slots, this build does not exit on SIGTERM (seen
here: still running 3 s later), so stops escalate. Metrics (``--metrics``):
``llamacpp:requests_processing``, ``llamacpp:requests_deferred``, ``llamacpp:predicted_tokens_seconds``,
``llamacpp:tokens_predicted_total``, ``llamacpp:prompt_tokens_total``. A first SIGTERM starts a
graceful shutdown; only a second one exits at once.

The executable is ``[server] command`` (an argv prefix, e.g. ``["/opt/llama/bin/llama-server"]``)
or ``llama-server`` from PATH. Never launches anything itself; it only describes the launch.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harvest.config import ServerConfig
from harvest.http import HttpError, SyncHttp
from harvest.server.base import (
    COMMON_FATAL,
    FatalPattern,
    MetricNames,
    ReadinessCheck,
    api_key_environment,
    bearer_headers,
    gpu_environment,
)

#: ``load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'false'`` (build 11434).
SLOTS_LINE = re.compile(r"n_slots = (\d+), n_ctx_slot = (\d+)(?:, kv_unified = '(\w+)')?")
#: ``llama_context: n_ctx = 8192`` (printed at a more verbose log level).
KV_LINE = re.compile(r"llama_context: n_ctx\s+=\s+(\d+)")

FATAL = (
    FatalPattern(r"failed to load model|error loading model|main: exiting due to model loading error",
                 "fatal_log", "llama.cpp could not load the model"),
    FatalPattern(r"cudaMalloc failed: out of memory|ggml_backend_cuda_buffer_type_alloc_buffer: allocating .* failed",
                 "out_of_memory", "the GPU ran out of memory"),
) + COMMON_FATAL


class LlamaCppAdapter:
    kind = "llamacpp"
    launched = True
    fatal_patterns = FATAL
    metrics = MetricNames(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        kv_usage=None,
        generation_throughput="llamacpp:predicted_tokens_seconds",
        generation_tokens_total="llamacpp:tokens_predicted_total",
        prompt_tokens_total="llamacpp:prompt_tokens_total",
    )

    def executable(self, config: ServerConfig) -> list[str]:
        return list(config.command) if config.command else ["llama-server"]

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
        argv = self.executable(config) + ["-m", str(config.model), "--host", config.host,
                                          "--port", str(config.port), "--metrics"]
        if config.max_running_requests is not None:
            argv += ["--parallel", str(config.max_running_requests)]
        if config.served_model_name:
            argv += ["--alias", config.served_model_name]
        if config.kv_cache_dtype:
            argv += ["--cache-type-k", config.kv_cache_dtype, "--cache-type-v", config.kv_cache_dtype]
        if config.gpus:
            argv += ["--n-gpu-layers", "all"]
        return argv + list(config.extra_args)

    def environment(self, config: ServerConfig) -> dict[str, str]:
        # The key goes through the environment (LLAMA_API_KEY), not the world-readable command line.
        return {**gpu_environment(config), **api_key_environment(config, "LLAMA_API_KEY")}

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        return (ReadinessCheck("health", path="/health"),)

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        slots = SLOTS_LINE.findall(log_text)
        if slots:
            n, per_slot, unified = slots[-1]
            # A unified cache is shared: every slot's n_ctx_slot is the whole of it.
            return int(per_slot) if unified == "true" else int(n) * int(per_slot)
        found = KV_LINE.findall(log_text)
        if found:
            return int(found[-1])
        try:
            r = client.get(f"{config.url}/props", headers=bearer_headers(config), timeout=10.0)
            if r.status == 200:
                props = r.json()
                per_slot = int(props["default_generation_settings"]["n_ctx"])
                split = config.max_running_requests is not None  # --parallel given: no unified cache
                return per_slot * int(props.get("total_slots", 1)) if split else per_slot
        except (HttpError, ValueError, KeyError, TypeError):
            pass
        return None

    def version(self, config: ServerConfig) -> str | None:
        try:
            out = subprocess.run([*self.executable(config), "--version"], capture_output=True, text=True,
                                 timeout=10.0, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"version: (\S+(?: \([0-9a-f]+\))?)", out.stdout + out.stderr)
        return m.group(1) if m else None
