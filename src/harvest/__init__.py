"""harvest: generate large datasets with an LLM served by SGLang or vLLM on multi-GPU machines.

Probe GPUs, refuse to launch into a dirty machine, launch the engine supervised, drive prompts
through it without losing or duplicating one, stop it with bounded escalation and measure that the
GPUs and the port are really free.
"""

from __future__ import annotations

__version__ = "0.1.0"

from harvest.config import (
    ClientConfig,
    DataConfig,
    HarvestConfig,
    OutputConfig,
    PreflightConfig,
    SamplingConfig,
    ServerConfig,
    load_config,
    parse_config,
)
from harvest.errors import (
    ConfigError,
    HarvestError,
    InputError,
    LaunchError,
    LedgerError,
    NoDriverError,
    PreflightFailed,
    ProbeError,
    RequestError,
    ServerError,
    ServerSick,
    StopError,
)

__all__ = [
    "ClientConfig",
    "ConfigError",
    "DataConfig",
    "HarvestConfig",
    "HarvestError",
    "InputError",
    "LaunchError",
    "LedgerError",
    "NoDriverError",
    "OutputConfig",
    "PreflightConfig",
    "PreflightFailed",
    "ProbeError",
    "RequestError",
    "SamplingConfig",
    "ServerConfig",
    "ServerError",
    "ServerSick",
    "StopError",
    "__version__",
    "load_config",
    "parse_config",
]
