"""An OpenAI-compatible endpoint that is already running (``engine = "openai"``).

harvest never launches or stops it: ``launched`` is False, and the supervisor only checks that
``GET {base_url}/v1/models`` answers, with the API key read from the environment variable the
config names (``api_key_env``). Metric names and KV capacity are unknown.
"""

from __future__ import annotations

from pathlib import Path

from harvest.config import ServerConfig
from harvest.http import SyncHttp
from harvest.server.base import MetricNames, ReadinessCheck


class OpenAIEndpointAdapter:
    kind = "openai"
    launched = False
    fatal_patterns = ()
    metrics = MetricNames(metrics_path=None)

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
        return []

    def environment(self, config: ServerConfig) -> dict[str, str]:
        return {}

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        return (ReadinessCheck("models", path="/v1/models"),)

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        return None

    def version(self, config: ServerConfig) -> str | None:
        return None
