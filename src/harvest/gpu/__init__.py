"""GPU and host measurement: the NVML probe, the nvidia-smi fallback, host memory, preflight rules.

Everything here is measured at call time; nothing is inferred from a command having returned.
Importing this package has no side effects (NVML is initialised only when a probe is opened).
"""

from __future__ import annotations

from harvest.gpu.host import disk_state, host_state
from harvest.gpu.nvml import NvmlProbe
from harvest.gpu.preflight import PreflightReport, RuleResult, run_preflight, wait_for_preflight
from harvest.gpu.probe import NO_DRIVER, NoGpuProbe, open_probe
from harvest.gpu.records import DiskState, GpuProbe, GpuProcess, GpuSnapshot, GpuState, HostState
from harvest.gpu.smi import SmiProbe

__all__ = [
    "NO_DRIVER",
    "DiskState",
    "GpuProbe",
    "GpuProcess",
    "GpuSnapshot",
    "GpuState",
    "HostState",
    "NoGpuProbe",
    "NvmlProbe",
    "PreflightReport",
    "RuleResult",
    "SmiProbe",
    "disk_state",
    "host_state",
    "open_probe",
    "run_preflight",
    "wait_for_preflight",
]
