"""A fake NVML backend: an object with pynvml's functions over a mutable in-memory machine.

Passed to ``NvmlProbe(backend=...)`` the way the real ``pynvml`` module is. Memory follows NVML's
v2 semantics (free = total - reserved - used); the v1 query reports reserved memory as used, like
the real driver. Tests change the machine between calls (a process appears, exits, memory grows)
and inject NVML errors per call and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

MIB = 1024 * 1024

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

_NAMES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
}


class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    total_mib: int = 143771
    reserved_mib: int = 615
    used_mib: int = 0
    utilization: int | None = 0
    #: (pid, MiB or None) as nvmlDeviceGetComputeRunningProcesses reports them.
    processes: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """The subset of pynvml harvest uses, over ``gpus``. ``fail[(call, index)] = code`` injects errors."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15", v2_supported: bool = True,
                 init_error: int | None = None, bytes_strings: bool = False):
        self.gpus = gpus
        self.driver = driver
        self.v2_supported = v2_supported
        self.init_error = init_error
        self.bytes_strings = bytes_strings
        self.fail: dict[tuple[str, int | None], int] = {}
        self.initialised = 0
        self.calls: list[str] = []

    def _enter(self, call: str, index: int | None = None) -> None:
        self.calls.append(call)
        if call != "nvmlInit" and self.initialised <= 0:
            raise FakeNVMLError(1)  # Uninitialized
        code = self.fail.get((call, index))
        if code is not None:
            raise FakeNVMLError(code)

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._str(self.driver)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetMemoryInfo(self, handle: SimpleNamespace, version: int | None = None) -> SimpleNamespace:
        i = handle.index
        gpu = self.gpus[i]
        total, reserved, used = gpu.total_mib * MIB, gpu.reserved_mib * MIB, gpu.used_mib * MIB
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", i)
            if not self.v2_supported:
                raise FakeNVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            return SimpleNamespace(version=version, total=total, reserved=reserved, used=used,
                                   free=total - reserved - used)
        self._enter("nvmlDeviceGetMemoryInfo", i)
        return SimpleNamespace(total=total, used=used + reserved, free=total - reserved - used)

    def nvmlDeviceGetName(self, handle: SimpleNamespace) -> str | bytes:
        self._enter("nvmlDeviceGetName", handle.index)
        return self._str(self.gpus[handle.index].name)

    def nvmlDeviceGetUUID(self, handle: SimpleNamespace) -> str | bytes:
        self._enter("nvmlDeviceGetUUID", handle.index)
        return self._str(self.gpus[handle.index].uuid)

    def nvmlDeviceGetUtilizationRates(self, handle: SimpleNamespace) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle.index)
        util = self.gpus[handle.index].utilization
        if util is None:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimpleNamespace) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle.index)
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB,
                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, mib in self.gpus[handle.index].processes]


def h200s(n: int = 1, **kwargs: object) -> list[FakeGpu]:
    """``n`` idle H200s (143771 MiB total, 615 MiB driver-reserved, as on a real idle H200)."""
    return [FakeGpu(uuid=f"GPU-0000000{i}-fake-h200", **kwargs) for i in range(n)]  # type: ignore[arg-type]


def unused_pid() -> int:
    """A pid no process can have here: above the kernel's pid_max."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read()) + 1
    except OSError:
        return 2**22 + 1  # the largest pid_max Linux allows is 2^22
