"""The one typed configuration of harvest, loaded from TOML.

A file holds any of these tables; each command reads the ones it needs:

    [server]      the engine to launch (or the endpoint to use) and the settings users tune
    [server.env]  extra environment variables for the engine process
    [preflight]   margins and thresholds of the launch-safety rules
    [data]        the input dataset and how its fields map to prompts
    [sampling]    generation parameters
    [client]      concurrency, timeouts, retries, extra endpoints
    [output]      the run folder
    [notify]      who is told when a run ends, stalls, relaunches its server or trips its breaker
    [host]        the box (over SSH, and/or inside a container) where the server runs; absent: here
    [[hosts]]     several such boxes, one server each, driven as one campaign
    [cluster]     a Ray cluster: servers placed as Ray actors, one supervised server each

Validation errors name the file, the table and the field. This package never touches the machine:
no probing, no folders created; relative paths are resolved against the config file's folder.

Its modules, from the bottom: ``base.py`` (the strict base model and the checks tables share),
``server.py`` ([server]), ``job.py`` ([preflight], [data], [sampling], [client], [run], [output]),
``hosts.py`` ([host], [[hosts]], [cluster]), ``notify.py`` ([notify]), ``file.py`` (``HarvestConfig``, the whole file) and
``load.py`` (TOML in, one message per mistake out). Import from ``harvest.config``.
"""

from __future__ import annotations

from harvest.config.base import (
    KEYLESS_ENGINES,
    LAUNCHED_ENGINES,
    MAX_CONCURRENCY,
    MAX_INT,
    NAME_MAX,
    PATH_MAX,
    EngineKind,
    check_path_text,
    is_loopback,
    public_host_problem,
    secret_flag_problem,
)
from harvest.config.file import HarvestConfig
from harvest.config.hosts import ClusterConfig, HostConfig
from harvest.config.job import (
    ClientConfig,
    DataConfig,
    OutputConfig,
    PreflightConfig,
    RunConfig,
    SamplingConfig,
)
from harvest.config.notify import NOTIFY_EVENTS, NotifyConfig, NotifyEvent
from harvest.config.load import COMMAND_LINE, KEYWORDS, RELATIVE_PATHS, Override, load_config, parse_config, parse_set
from harvest.config.server import VLLM_MAX_LOGPROBS, ServerConfig, engine_logprobs_limit

__all__ = [
    "COMMAND_LINE",
    "KEYWORDS",
    "ClientConfig",
    "ClusterConfig",
    "DataConfig",
    "EngineKind",
    "HarvestConfig",
    "HostConfig",
    "KEYLESS_ENGINES",
    "LAUNCHED_ENGINES",
    "MAX_CONCURRENCY",
    "MAX_INT",
    "NAME_MAX",
    "NOTIFY_EVENTS",
    "NotifyConfig",
    "NotifyEvent",
    "OutputConfig",
    "Override",
    "PATH_MAX",
    "PreflightConfig",
    "RELATIVE_PATHS",
    "RunConfig",
    "SamplingConfig",
    "ServerConfig",
    "VLLM_MAX_LOGPROBS",
    "check_path_text",
    "engine_logprobs_limit",
    "is_loopback",
    "load_config",
    "parse_config",
    "parse_set",
    "public_host_problem",
    "secret_flag_problem",
]
