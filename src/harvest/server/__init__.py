"""Engine servers: adapters per engine kind, the supervised launch and the verified stop.

    async with Server(config, run_dir=run_dir) as server:   # preflight, spawn, readiness
        ...                                                 # server.url
    report = stop_run(run_dir)                              # from any process, via the state file

Nothing here kills by name: only the recorded process group and recorded (pid, create time) pairs.
"""

from __future__ import annotations

from harvest.server.base import ENGINES, EngineAdapter, FatalPattern, MetricNames, ReadinessCheck, adapter_for
from harvest.server.state import (
    LaunchRecord,
    ProcessRef,
    RunState,
    RunStatus,
    StateFile,
    list_runs,
    redact_argv,
    state_dir,
)
from harvest.server.stop import Holder, StopReport, StopStep, stop_run
from harvest.server.supervisor import Server

__all__ = [
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
    "adapter_for",
    "list_runs",
    "redact_argv",
    "state_dir",
    "stop_run",
]
