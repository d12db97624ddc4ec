"""Any command line plus a health URL (``engine = "command"``).

``[server] command`` is the argv; ``{host}``, ``{port}`` and ``{model}`` in it are replaced by the
config's values. Readiness is ``GET health_url`` answering 2xx, or, without a health URL, the port
accepting connections. Only the common fatal patterns apply (out of memory, address in use, NCCL,
a Python traceback). Never launches anything itself; it only describes the launch.
"""

from __future__ import annotations

from pathlib import Path

from harvest.config import ServerConfig
from harvest.http import SyncHttp
from harvest.server.base import COMMON_FATAL, MetricNames, ReadinessCheck, gpu_environment


class CommandAdapter:
    kind = "command"
    launched = True
    fatal_patterns = COMMON_FATAL
    metrics = MetricNames(metrics_path=None)

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
        values = {"host": config.host, "port": str(config.port), "model": config.model or ""}
        out = []
        for arg in config.command:
            for key, value in values.items():
                arg = arg.replace("{" + key + "}", value)
            out.append(arg)
        return out + list(config.extra_args)

    def environment(self, config: ServerConfig) -> dict[str, str]:
        return gpu_environment(config)

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        if config.health_url:
            url = config.health_url.replace("{port}", str(config.port)).replace("{host}", config.host)
            return (ReadinessCheck("health", url=url),)
        return (ReadinessCheck("port", kind="port"),)

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        return None

    def version(self, config: ServerConfig) -> str | None:
        return None
