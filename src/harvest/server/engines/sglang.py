"""SGLang's server (``python -m sglang.launch_server``).

Checked against SGLang 0.5.23 (:data:`harvest.engine_pins.PINS`): the argv below is parsed by the
wheel's own ``ServerArgs.add_cli_args`` in ``tests/server/test_engine_contract.py``; the rest was
read from its source (no GPU here, so it was not run). ``--model-path``, ``--tp-size``,
``--mem-fraction-static`` (weights + KV pool only; activations and CUDA graphs come on top),
``--kv-cache-dtype`` (its own choices, checked at config load), ``--enable-hierarchical-cache
--hicache-size N`` (an int: GB of 10^9 bytes per rank) or ``--hicache-ratio R``,
``--max-running-requests``, ``--reasoning-parser`` (fills ``reasoning_content``),
``--enable-metrics``. The API key goes in a YAML file handed over with ``--config`` (written 0600
in the run folder, removed once start-up ended), so it stays off ``/proc/PID/cmdline``. Readiness is ``GET /health`` then a
one-token ``POST /generate`` (``/health`` can answer before the scheduler serves). The KV capacity
is ``max_total_num_tokens`` in ``GET /server_info`` (``/get_server_info`` is deprecated in 0.5.23;
tried second, for older servers). Metrics: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:token_usage``, ``sglang:gen_throughput``.

Never launches anything itself; it only describes the launch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harvest.config import ServerConfig
from harvest.http import HttpError, SyncHttp
from harvest.server.base import (
    COMMON_FATAL,
    FatalPattern,
    MetricNames,
    ReadinessCheck,
    bearer_headers,
    gpu_environment,
    python_of,
    python_package_version,
)

#: SGLang logs ``max_total_num_tokens=376832`` when its memory pool is sized.
KV_LINE = re.compile(r"max_total_num_tokens=(\d+)")

#: Engine-specific patterns first (the shared ``^Traceback`` comes last). Lines from SGLang 0.5.23:
#: ``srt/model_executor/pool_configurator.py`` "Not enough memory. Please try to increase
#: --mem-fraction-static."; ``srt/mem_cache/pool_host/base.py`` "Not enough host memory available.
#: Requesting ..."; ``srt/managers/scheduler.py`` "Scheduler hit an exception: ..."; 
#: ``srt/entrypoints/engine.py`` "Rank N scheduler died during initialization (exit code: ...)".
#: Scheduler lines carry the prefix ``[%(asctime)s TP3]`` (``configure_logger``) with tp > 1.
FATAL = (
    FatalPattern(r"Not enough memory\. Please try to increase --mem-fraction-static|"
                 r"RuntimeError: Not enough memory", "out_of_memory", "SGLang found no room for the KV cache"),
    FatalPattern(r"Not enough host memory", "out_of_memory",
                 "SGLang found no room in host RAM for the hierarchical cache"),
    FatalPattern(r"Scheduler hit an exception|Rank \d+ scheduler died during initialization|"
                 r"Rank \d+ scheduler is dead|"
                 r"^\[[^\]\n]* TP\d+[^\]\n]*\] (?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): ",
                 "fatal_log", "an SGLang scheduler died"),
) + COMMON_FATAL

#: The file (in the run folder) that carries SGLang's API key to ``--config``.
KEY_FILE = "sglang-secrets.yaml"


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

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
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
                argv += ["--hicache-size", str(config.hicache_size)]
            if config.hicache_ratio is not None:
                argv += ["--hicache-ratio", str(config.hicache_ratio)]
        if config.max_running_requests is not None:
            argv += ["--max-running-requests", str(config.max_running_requests)]
        if config.dtype:
            argv += ["--dtype", config.dtype]
        if config.reasoning_parser:
            argv += ["--reasoning-parser", config.reasoning_parser]
        if config.api_key() is not None:
            if run_dir is None:
                raise ValueError("SGLang's API key goes in a --config file in the run folder: argv() needs run_dir")
            argv += ["--config", str(Path(run_dir) / KEY_FILE)]
        return argv + list(config.extra_args)

    def private_files(self, config: ServerConfig) -> dict[str, str]:
        """Files the supervisor writes (0600) into the run folder before the spawn: the API key as
        SGLang's ``--config`` YAML (a JSON string is a YAML double-quoted scalar)."""
        key = config.api_key()
        return {KEY_FILE: f"api-key: {json.dumps(key.get_secret_value())}\n"} if key is not None else {}

    def environment(self, config: ServerConfig) -> dict[str, str]:
        return gpu_environment(config)

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        return (
            ReadinessCheck("health", path="/health"),
            ReadinessCheck("one-token generation", method="POST", path="/generate",
                           json={"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}),
        )

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        for path in ("/server_info", "/get_server_info"):
            try:
                r = client.get(f"{config.url}{path}", headers=bearer_headers(config), timeout=10.0)
                if r.status != 200:
                    continue
                info = r.json()
                value = info.get("max_total_num_tokens")
                if value is None and isinstance(info.get("internal_states"), list) and info["internal_states"]:
                    value = info["internal_states"][0].get("max_total_num_tokens")
                if value is not None:
                    return int(value)
            except (HttpError, ValueError, TypeError, AttributeError):
                continue
        found = KV_LINE.findall(log_text)
        return int(found[-1]) if found else None

    def version(self, config: ServerConfig) -> str | None:
        return python_package_version(python_of(config), ("sglang",))

