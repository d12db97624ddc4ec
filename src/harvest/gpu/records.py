"""Records of measured GPU and host state, and the probe seam.

These are *measured* values: each record says where it came from (NVML, nvidia-smi, psutil) and
when. Nothing here is inferred from a command having returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

ProbeSource = Literal["nvml", "nvidia-smi", "none"]


@dataclass(frozen=True)
class GpuProcess:
    """A compute process holding memory on a GPU, as the driver reports it."""

    pid: int
    #: Process name from our pid namespace; None when the pid is not visible here.
    name: str | None
    #: MiB used on this GPU; None when the driver does not say (NVML returns None in some setups).
    used_mib: int | None
    #: False when the pid is not in this pid namespace (e.g. the probe runs in a container): the pid
    #: then belongs to another namespace and must not be looked up or signalled here.
    visible: bool = True


@dataclass(frozen=True)
class GpuState:
    """One GPU at one moment."""

    index: int
    uuid: str
    name: str
    total_mib: int
    #: Memory used by allocations (NVML v2: excludes driver-reserved memory where the driver says so).
    used_mib: int
    free_mib: int
    #: Driver-reserved MiB when the v2 query reports it, else None.
    reserved_mib: int | None
    utilization_pct: int | None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class HostState:
    """Host memory and swap, in MiB (psutil)."""

    ram_total_mib: int
    ram_available_mib: int
    swap_total_mib: int
    swap_used_mib: int
    #: What this process's memory cgroup still allows (limit - usage net of page cache), in MiB;
    #: None without a limit (or where it cannot be read).
    cgroup_headroom_mib: int | None = None


@dataclass(frozen=True)
class DiskState:
    """Free space of the file system that holds ``path``."""

    path: str
    total_mib: int
    free_mib: int


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything one probe call saw."""

    source: ProbeSource
    gpus: tuple[GpuState, ...]
    driver_version: str | None = None
    #: Why no GPU is visible (e.g. "no NVIDIA driver found"), None when GPUs were probed.
    unavailable_reason: str | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class GpuProbe(Protocol):
    """Measures GPUs. Lifecycle: construct (may raise NoDriverError) -> snapshot()* -> close().

    Verification paths call these and must see failures: a probe raises ProbeError instead of
    returning a default value.
    """

    source: ProbeSource

    def snapshot(self) -> GpuSnapshot:
        """All GPUs with their processes."""
        ...

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        """Used MiB for each GPU index, cheap enough to poll at >= 10 Hz."""
        ...

    def close(self) -> None:
        """Release the driver handle. Idempotent."""
        ...


__all__ = ["DiskState", "GpuProbe", "GpuProcess", "GpuSnapshot", "GpuState", "HostState", "ProbeSource"]
