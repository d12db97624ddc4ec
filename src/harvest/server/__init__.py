"""Engine servers: adapters per engine kind, the supervised launch and the verified stop.

    async with Server(config, run_dir=run_dir) as server:   # preflight, spawn, readiness
        ...                                                 # server.url
    report = stop_run(run_dir)                              # from any process, via the state file

Nothing here kills by name: only the recorded process group and recorded (pid, create time) pairs.

This package is the facade the placement kinds import (``.importlinter``: they never reach
``harvest.server.state``, ``.stop``, ``.procs``... directly): what they need is exported below.
"""

from __future__ import annotations

from harvest.server.base import (
    ENGINES,
    EngineAdapter,
    FatalPattern,
    MetricNames,
    ReadinessCheck,
    adapter_for,
    engine_paths,
)
from harvest.server.batch import batch_limit, batch_limit_exact, has_metrics
from harvest.server.procs import alive, group_findings, signal_verified, verified
from harvest.server.state import (
    LaunchRecord,
    ProcessRef,
    RunState,
    RunStatus,
    StateFile,
    WATCH_LOG,
    default_run_dir,
    hold_index,
    list_runs,
    redact_argv,
    state_dir,
)
from harvest.server.stop import DEFAULT_MARGIN_MIB, Holder, StopReport, StopStep, stop_run
from harvest.server.supervisor import Server, check_run_dir

__all__ = [
    "DEFAULT_MARGIN_MIB",
    "ENGINES",
    "EngineAdapter",
    "FatalPattern",
    "Holder",
    "LaunchRecord",
    "MetricNames",
    "ProcessRef",
    "ReadinessCheck",
    "RunState",
    "RunStatus",
    "Server",
    "StateFile",
    "StopReport",
    "StopStep",
    "WATCH_LOG",
    "adapter_for",
    "alive",
    "batch_limit",
    "batch_limit_exact",
    "check_run_dir",
    "default_run_dir",
    "engine_paths",
    "group_findings",
    "has_metrics",
    "hold_index",
    "list_runs",
    "redact_argv",
    "signal_verified",
    "state_dir",
    "stop_run",
    "verified",
]
