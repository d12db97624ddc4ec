"""harvest: generate large datasets with an LLM (vLLM, SGLang, llama.cpp, `transformers serve` or any
OpenAI-compatible endpoint), on one machine, remote boxes or a Ray cluster.

From Python (docs/python-api.md): ``harvest.run("job.toml")`` returns the run folder and the counts
by status; ``await harvest.arun(...)`` inside a running event loop; ``harvest.status(run_dir)``,
``harvest.export(run_dir, "sharegpt")``.

Probe GPUs, refuse to launch into a dirty machine, launch the engine supervised, drive prompts
through it without losing or duplicating one, stop it with bounded escalation and measure that the
GPUs and the port are really free.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from harvest.lazy import lazy
from harvest.version import __version__

#: What the package's top offers, and the module each comes from. Imported on first use (PEP 562):
#: ``import harvest`` alone, or any ``harvest.<module>``, loads neither the config models (pydantic)
#: nor the client, so a command that needs neither (``harvest stop``, ``status``) starts without them.
_LAZY = {
    **dict.fromkeys(("ClientConfig", "DataConfig", "HarvestConfig", "OutputConfig", "PreflightConfig",
                     "SamplingConfig", "ServerConfig", "load_config", "parse_config"), "harvest.config"),
    **dict.fromkeys(("ConfigError", "HarvestError", "InputError", "LaunchError", "LedgerError", "NoDriverError",
                     "NothingToExport", "PreflightFailed", "ProbeError", "RequestError", "ServerError",
                     "ServerSick", "StopError"), "harvest.errors"),
}

if TYPE_CHECKING:
    from harvest.config import (ClientConfig, DataConfig, HarvestConfig, OutputConfig, PreflightConfig,
                                SamplingConfig, ServerConfig, load_config, parse_config)
    from harvest.errors import (ConfigError, HarvestError, InputError, LaunchError, LedgerError, NoDriverError,
                                NothingToExport, PreflightFailed, ProbeError, RequestError, ServerError,
                                ServerSick, StopError)


__getattr__ = lazy(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# A library says nothing unless its caller configures logging (the command line does): without a
# handler of its own, Python's last-resort handler would print harvest's warnings to stderr.
logging.getLogger("harvest").addHandler(logging.NullHandler())


def run(job: Any = None, **keywords: Any) -> Any:
    """Run or resume a job (a file, a config, or keywords) and wait for it: :func:`harvest.api.run`."""
    from harvest import api

    return api.run(job, **keywords)


async def arun(job: Any = None, **keywords: Any) -> Any:
    """:func:`run` inside a running event loop (a notebook): :func:`harvest.api.arun`."""
    from harvest import api

    return await api.arun(job, **keywords)


def status(run_dir: Any, **keywords: Any) -> Any:
    """Where a run stands (``harvest status``): :func:`harvest.api.status`."""
    from harvest import api

    return api.status(run_dir, **keywords)


def export(run_dir: Any, format: str = "sharegpt", **keywords: Any) -> Any:
    """Write a run's results to a file (``harvest export``): :func:`harvest.api.export`."""
    from harvest import api

    return api.export(run_dir, format, **keywords)


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
    "NothingToExport",
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
    "arun",
    "export",
    "load_config",
    "parse_config",
    "run",
    "status",
]
