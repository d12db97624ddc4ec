"""SGLang's server (``python -m sglang.launch_server``).

Written from SGLang's documented interface (no SGLang install was read here; checked against the
0.4/0.5 series): ``--model-path``, ``--tp-size``, ``--mem-fraction-static``, ``--kv-cache-dtype``,
``--enable-hierarchical-cache --hicache-size`` (GB of host RAM per rank), ``--max-running-requests``,
``--enable-metrics``. Readiness is ``GET /health`` then a one-token ``POST /generate`` (``/health``
can answer before the scheduler serves). The KV capacity is ``max_total_num_tokens`` in
``GET /get_server_info``. Metrics: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:token_usage``, ``sglang:gen_throughput``.

Never launches anything itself; it only describes the launch.
"""

from __future__ import annotations

import re

import httpx

from harvest.config import ServerConfig
from harvest.server.base import (
    COMMON_FATAL,
    FatalPattern,
    MetricNames,
    ReadinessCheck,
    api_key_args,
    bearer_headers,
    gpu_environment,
    python_of,
    python_package_version,
)

#: SGLang logs ``max_total_num_tokens=376832`` when its memory pool is sized.
KV_LINE = re.compile(r"max_total_num_tokens=(\d+)")

FATAL = COMMON_FATAL + (
    FatalPattern(r"Not enough memory\. Please try to increase --mem-fraction-static|"
                 r"RuntimeError: Not enough memory", "out_of_memory", "SGLang found no room for the KV cache"),
    FatalPattern(r"Scheduler hit an exception|Rank \d+ scheduler is dead|TP\d+ .*Exception", "fatal_log",
                 "an SGLang scheduler died"),
)


class SGLangAdapter:
    kind = "sglang"
    launched = True
    fatal_patterns = FATAL
    metrics = MetricNames(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
        generation_throughput="sglang:gen_throughput",
        generation_tokens_total="sglang:generation_tokens_total",
        prompt_tokens_total="sglang:prompt_tokens_total",
    )

    def argv(self, config: ServerConfig) -> list[str]:
        argv = [python_of(config), "-m", "sglang.launch_server",
                "--model-path", str(config.model), "--host", config.host, "--port", str(config.port),
                "--tp-size", str(config.tp), "--enable-metrics"]
        if config.served_model_name:
            argv += ["--served-model-name", config.served_model_name]
        if config.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", str(config.mem_fraction_static)]
        if config.kv_cache_dtype:
            argv += ["--kv-cache-dtype", config.kv_cache_dtype]
        if config.enable_hierarchical_cache:
            argv += ["--enable-hierarchical-cache"]
            if config.hicache_size is not None:
                argv += ["--hicache-size", _number(config.hicache_size)]
        if config.max_running_requests is not None:
            argv += ["--max-running-requests", str(config.max_running_requests)]
        if config.dtype:
            argv += ["--dtype", config.dtype]
        return argv + api_key_args(config) + list(config.extra_args)

    def environment(self, config: ServerConfig) -> dict[str, str]:
        return gpu_environment(config)

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        return (
            ReadinessCheck("health", path="/health"),
            ReadinessCheck("one-token generation", method="POST", path="/generate",
                           json={"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}),
        )

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: httpx.Client) -> int | None:
        try:
            r = client.get(f"{config.url}/get_server_info", headers=bearer_headers(config), timeout=10.0)
            if r.status_code == 200:
                info = r.json()
                value = info.get("max_total_num_tokens")
                if value is None and isinstance(info.get("internal_states"), list) and info["internal_states"]:
                    value = info["internal_states"][0].get("max_total_num_tokens")
                if value is not None:
                    return int(value)
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            pass
        found = KV_LINE.findall(log_text)
        return int(found[-1]) if found else None

    def version(self, config: ServerConfig) -> str | None:
        return python_package_version(python_of(config), ("sglang",))


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
