"""The NVML probe: GPU memory, utilization and compute processes through nvidia-ml-py.

All NVML calls go through one wrapper with one error policy: a failed query raises
:class:`~harvest.errors.ProbeError` naming the GPU index and the NVML call, so verification never
sees a silent default. Only display-only values (utilization, driver version) degrade to None, and
then the snapshot says so in its warnings.

The NVML module is passed in as ``backend`` (``pynvml`` by default, imported when the probe is
built, never at import time). Tests pass a fake backend object with the same functions.

This module never signals or names-guesses a process: a pid NVML reports that this host cannot see
(another pid namespace) is recorded with ``visible=False`` and no name.
"""

from __future__ import annotations

from typing import Any

from harvest.errors import NoDriverError, ProbeError
from harvest.gpu.host import in_host_pid_namespace, resolve_gpu_pid
from harvest.gpu.records import GpuProcess, GpuSnapshot, GpuState, ProbeSource

_MIB = 1024 * 1024

# NVML return codes (nvml.h); read from the backend when it defines them.
_NOT_SUPPORTED = 3
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_ARGUMENT_VERSION_MISMATCH = 25
_GPU_NOT_FOUND = 28


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """Measures GPUs through NVML. Lifecycle: construct (nvmlInit) -> snapshot()* -> close().

    ``backend`` is the NVML module (``pynvml``) or an object with the same functions.
    ``host_pid_namespace`` says whether NVML's pids are from this pid namespace; None measures it.
    Raises :class:`NoDriverError` when the NVML library or the driver cannot be loaded.
    """

    source: ProbeSource = "nvml"

    def __init__(self, backend: Any = None, *, host_pid_namespace: bool | None = None):
        if backend is None:
            try:
                import pynvml  # noqa: PLC0415 - imported on use, never at import time
            except ImportError as exc:
                raise NoDriverError("nvidia-ml-py is not installed", call="import pynvml") from exc
            backend = pynvml
        self._nvml = backend
        self._error: type[BaseException] = getattr(backend, "NVMLError", Exception)
        self._no_driver = {
            getattr(backend, "NVML_ERROR_LIBRARY_NOT_FOUND", _LIBRARY_NOT_FOUND),
            getattr(backend, "NVML_ERROR_DRIVER_NOT_LOADED", _DRIVER_NOT_LOADED),
        }
        self._v2_unsupported = {
            getattr(backend, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED),
            getattr(backend, "NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND),
            getattr(backend, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", _ARGUMENT_VERSION_MISMATCH),
        }
        self._not_supported = getattr(backend, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED)
        try:
            backend.nvmlInit()
        except self._error as exc:
            if getattr(exc, "value", None) in self._no_driver:
                raise NoDriverError(f"no NVIDIA driver found (NVML: {exc})", call="nvmlInit") from exc
            raise ProbeError(f"NVML failed to initialise: {exc}", call="nvmlInit") from exc
        except OSError as exc:  # a broken libnvidia-ml that loads but cannot resolve symbols
            raise NoDriverError(f"no NVIDIA driver found (NVML: {exc})", call="nvmlInit") from exc
        self._closed = False
        self._handles: dict[int, Any] = {}
        #: None until the first memory query tells whether the v2 (reserved-aware) query works.
        self._mem_v2: bool | None = None if hasattr(backend, "nvmlMemory_v2") else False
        self._mem_note: str | None = (
            None if hasattr(backend, "nvmlMemory_v2")
            else "this nvidia-ml-py has no v2 memory query; used memory includes driver-reserved memory"
        )
        self._host_ns = in_host_pid_namespace() if host_pid_namespace is None else host_pid_namespace

    # -- the one wrapper -------------------------------------------------------------------------

    def _query(self, call: str, *args: Any, gpu: int | None = None, **kwargs: Any) -> Any:
        """Call ``backend.<call>``; any NVML failure becomes a ProbeError naming the GPU and call."""
        if self._closed:
            raise ProbeError("the NVML probe is closed", gpu=gpu, call=call)
        try:
            return getattr(self._nvml, call)(*args, **kwargs)
        except self._error as exc:
            raise ProbeError(f"NVML query failed: {exc}", gpu=gpu, call=call) from exc

    def _count(self) -> int:
        return int(self._query("nvmlDeviceGetCount"))

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._query("nvmlDeviceGetHandleByIndex", index, gpu=index)
            self._handles[index] = handle
        return handle

    def _memory(self, index: int) -> tuple[int, int, int, int | None]:
        """(total, used, free, reserved) in MiB; v2 where the driver has it, else v1 (noted)."""
        handle = self._handle(index)
        if self._mem_v2 is not False:
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle, version=self._nvml.nvmlMemory_v2)
            except self._error as exc:
                if getattr(exc, "value", None) not in self._v2_unsupported:
                    raise ProbeError(f"NVML query failed: {exc}", gpu=index,
                                     call="nvmlDeviceGetMemoryInfo(v2)") from exc
                self._mem_v2 = False
                self._mem_note = (f"NVML v2 memory query unsupported by this driver ({exc}); "
                                  "used memory includes driver-reserved memory (v1 query)")
            else:
                self._mem_v2 = True
                return (mem.total // _MIB, mem.used // _MIB, mem.free // _MIB, mem.reserved // _MIB)
        mem = self._query("nvmlDeviceGetMemoryInfo", handle, gpu=index)
        return mem.total // _MIB, mem.used // _MIB, mem.free // _MIB, None

    def _check_index(self, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ProbeError(f"no GPU with index {index}: NVML sees {count} GPU(s)", gpu=index)

    # -- the probe API ---------------------------------------------------------------------------

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        """Used MiB per GPU index: one NVML memory query per GPU (cheap: poll at >= 10 Hz)."""
        count = self._count() if indices else 0
        out: dict[int, int] = {}
        for index in indices:
            self._check_index(index, count)
            out[index] = self._memory(index)[1]
        return out

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """Compute processes on one GPU; MiB None where NVML does not report it."""
        raw = self._query("nvmlDeviceGetComputeRunningProcesses", self._handle(index), gpu=index)
        by_pid: dict[int, int | None] = {}
        for entry in raw:
            pid = int(entry.pid)
            used = getattr(entry, "usedGpuMemory", None)
            mib = None if used is None else int(used) // _MIB
            if pid in by_pid:  # one entry per MIG instance: add up what is known
                prev = by_pid[pid]
                by_pid[pid] = None if prev is None or mib is None else prev + mib
            else:
                by_pid[pid] = mib
        procs = []
        for pid, mib in by_pid.items():
            visible, name = resolve_gpu_pid(pid, host_namespace=self._host_ns)
            procs.append(GpuProcess(pid=pid, name=name, used_mib=mib, visible=visible))
        return tuple(procs)

    def _utilization(self, index: int, warnings: list[str]) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetUtilizationRates(self._handle(index)).gpu)
        except self._error as exc:
            if getattr(exc, "value", None) != self._not_supported:
                warnings.append(f"GPU {index}: utilization unavailable ({exc})")
            return None

    def snapshot(self) -> GpuSnapshot:
        """Every GPU with memory, utilization and compute processes. Raises ProbeError on failure."""
        warnings: list[str] = []
        try:
            driver: str | None = _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._error as exc:
            driver = None
            warnings.append(f"driver version unavailable ({exc})")
        gpus = []
        for index in range(self._count()):
            handle = self._handle(index)
            total, used, free, reserved = self._memory(index)
            gpus.append(GpuState(
                index=index,
                uuid=_text(self._query("nvmlDeviceGetUUID", handle, gpu=index)),
                name=_text(self._query("nvmlDeviceGetName", handle, gpu=index)),
                total_mib=total,
                used_mib=used,
                free_mib=free,
                reserved_mib=reserved,
                utilization_pct=self._utilization(index, warnings),
                processes=self.processes(index),
            ))
        if self._mem_note:
            warnings.insert(0, self._mem_note)
        if self._host_ns is not True and any(not p.visible for g in gpus for p in g.processes):
            warnings.append("some GPU processes are not visible in this pid namespace (container?): "
                            "their pids belong to another namespace")
        return GpuSnapshot(source="nvml", gpus=tuple(gpus), driver_version=driver, warnings=tuple(warnings))

    def close(self) -> None:
        """nvmlShutdown once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._handles.clear()
        try:
            self._nvml.nvmlShutdown()
        except self._error:
            # Shutting down a library that already lost its driver changes nothing we measure.
            pass

    def __enter__(self) -> NvmlProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["NvmlProbe"]
