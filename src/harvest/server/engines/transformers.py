"""Hugging Face ``transformers serve`` (``python -m transformers.cli.transformers serve MODEL``).

Read from transformers 5.19.0 (``transformers/cli/serve.py``, ``cli/serving/server.py``): the model
is the positional argument; ``--continuous-batching`` enables paged attention, tuned by
``--cb-block-size``, ``--cb-num-blocks``, ``--cb-max-batch-tokens``, ``--cb-max-memory-percent``
(fraction 0..1, here from ``gpu_memory_utilization``), ``--cb-use-cuda-graph``. Readiness is
``GET /health`` only: ``/v1/models`` answered 500 for minutes on the GPU machine, and ``/metrics``
does not exist (no Prometheus metrics). The KV capacity is not reported.

Never launches anything itself; it only describes the launch.
"""

from __future__ import annotations

from pathlib import Path

from harvest.config import ServerConfig
from harvest.http import SyncHttp
from harvest.server.base import (
    COMMON_FATAL,
    FatalPattern,
    MetricNames,
    ReadinessCheck,
    gpu_environment,
    python_of,
    python_package_version,
)

FATAL = (
    FatalPattern(r"Missing dependencies for serving", "fatal_log", "transformers' serving extras are missing"),
) + COMMON_FATAL


class TransformersAdapter:
    kind = "transformers"
    launched = True
    fatal_patterns = FATAL
    metrics = MetricNames(metrics_path=None)

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
        argv = [python_of(config), "-m", "transformers.cli.transformers", "serve", str(config.model),
                "--continuous-batching", "--host", config.host, "--port", str(config.port),
                "--device", "cuda:0" if config.gpus else "auto"]
        if config.dtype:
            argv += ["--dtype", config.dtype]
        if config.gpu_memory_utilization is not None:
            argv += ["--cb-max-memory-percent", str(config.gpu_memory_utilization)]
        return argv + list(config.extra_args)

    def environment(self, config: ServerConfig) -> dict[str, str]:
        return gpu_environment(config)

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        return (ReadinessCheck("health", path="/health"),)

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        return None

    def version(self, config: ServerConfig) -> str | None:
        return python_package_version(python_of(config), ("transformers",))
