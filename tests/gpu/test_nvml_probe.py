"""NvmlProbe through a fake NVML backend: memory semantics, processes, error policy, lifecycle."""

from __future__ import annotations

import os

import psutil
import pytest

from harvest.errors import NoDriverError, ProbeError
from harvest.gpu import NvmlProbe
from tests.gpu.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeGpu,
    FakeNvml,
    h200s,
    unused_pid,
)


def test_v2_memory_excludes_driver_reserved_memory():
    nvml = FakeNvml(h200s(2, used_mib=1000), bytes_strings=True)
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        snap = probe.snapshot()
    assert snap.source == "nvml"
    assert snap.driver_version == "550.54.15"
    assert [g.index for g in snap.gpus] == [0, 1]
    g = snap.gpus[0]
    assert (g.name, g.uuid) == ("NVIDIA H200", "GPU-00000000-fake-h200")  # bytes decoded
    assert (g.total_mib, g.used_mib, g.reserved_mib) == (143771, 1000, 615)
    assert g.free_mib == 143771 - 615 - 1000
    assert not any("v1" in w for w in snap.warnings)


def test_v1_fallback_counts_reserved_as_used_and_says_so():
    nvml = FakeNvml(h200s(1, used_mib=1000), v2_supported=False)
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        snap = probe.snapshot()
        assert probe.memory_used([0]) == {0: 1615}
    g = snap.gpus[0]
    assert (g.used_mib, g.reserved_mib, g.free_mib) == (1615, None, 143771 - 1615)
    assert any("v1" in w and "driver-reserved" in w for w in snap.warnings)


def test_processes_name_visible_pids_and_keep_unknown_mib_unknown():
    me = os.getpid()
    ghost = unused_pid()
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", used_mib=50000, processes=[(me, 40960), (ghost, None)])])
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        procs = {p.pid: p for p in probe.snapshot().gpus[0].processes}
    assert procs[me].visible and procs[me].name == psutil.Process(me).name()
    assert procs[me].used_mib == 40960
    assert not procs[ghost].visible and procs[ghost].name is None
    assert procs[ghost].used_mib is None


def test_nested_pid_namespace_never_names_a_pid_without_a_gpu_handle():
    # In a container NVML reports host pids; a process here with the same number that holds no
    # /dev/nvidia* device (this test process) must not be taken for it.
    me = os.getpid()
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", processes=[(me, 1024)])])
    with NvmlProbe(nvml, host_pid_namespace=False) as probe:
        snap = probe.snapshot()
    (proc,) = snap.gpus[0].processes
    assert (proc.pid, proc.visible, proc.name, proc.used_mib) == (me, False, None, 1024)
    assert any("pid namespace" in w for w in snap.warnings)


def test_one_entry_per_mig_instance_is_summed_per_pid():
    me = os.getpid()
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", processes=[(me, 100), (me, 200)])])
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        (proc,) = probe.snapshot().gpus[0].processes
    assert proc.used_mib == 300


def test_memory_used_reads_only_memory():
    nvml = FakeNvml(h200s(3, used_mib=7))
    nvml.gpus[2].used_mib = 9
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        nvml.calls.clear()
        assert probe.memory_used([0, 2]) == {0: 7, 2: 9}
        # Cheap enough for >= 10 Hz polling: no process listing, no name lookups.
        assert set(nvml.calls) <= {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                                   "nvmlDeviceGetMemoryInfo_v2"}
        assert probe.memory_used([]) == {}


def test_verification_queries_raise_with_gpu_index_and_call():
    nvml = FakeNvml(h200s(2))
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        nvml.fail[("nvmlDeviceGetMemoryInfo_v2", 1)] = NVML_ERROR_GPU_IS_LOST
        with pytest.raises(ProbeError) as info:
            probe.memory_used([0, 1])
        assert info.value.gpu == 1 and "nvmlDeviceGetMemoryInfo" in (info.value.call or "")
        assert "GPU 1" in str(info.value) and "GPU is lost" in str(info.value)
        with pytest.raises(ProbeError):
            probe.snapshot()
        nvml.fail.clear()
        nvml.fail[("nvmlDeviceGetComputeRunningProcesses", 0)] = NVML_ERROR_GPU_IS_LOST
        with pytest.raises(ProbeError) as info:
            probe.snapshot()
        assert info.value.gpu == 0 and info.value.call == "nvmlDeviceGetComputeRunningProcesses"


def test_unknown_gpu_index_raises():
    with NvmlProbe(FakeNvml(h200s(1)), host_pid_namespace=True) as probe:
        with pytest.raises(ProbeError) as info:
            probe.memory_used([3])
    assert info.value.gpu == 3


def test_utilization_not_supported_is_none_other_errors_are_noted():
    nvml = FakeNvml(h200s(2, utilization=None))
    nvml.gpus[1].utilization = 55
    with NvmlProbe(nvml, host_pid_namespace=True) as probe:
        snap = probe.snapshot()
        assert [g.utilization_pct for g in snap.gpus] == [None, 55]
        assert not any("utilization" in w for w in snap.warnings)
        nvml.fail[("nvmlDeviceGetUtilizationRates", 1)] = NVML_ERROR_GPU_IS_LOST
        snap = probe.snapshot()
    assert snap.gpus[1].utilization_pct is None
    assert any("GPU 1: utilization unavailable" in w for w in snap.warnings)


@pytest.mark.parametrize("code", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_library_or_driver_is_no_driver_error(code):
    with pytest.raises(NoDriverError) as info:
        NvmlProbe(FakeNvml([], init_error=code))
    assert "no NVIDIA driver found" in str(info.value)


def test_a_broken_driver_is_not_reported_as_absent():
    with pytest.raises(ProbeError) as info:
        NvmlProbe(FakeNvml(h200s(1), init_error=NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    assert not isinstance(info.value, NoDriverError)
    assert info.value.call == "nvmlInit"


def test_close_is_idempotent_and_later_queries_raise():
    nvml = FakeNvml(h200s(1))
    probe = NvmlProbe(nvml, host_pid_namespace=True)
    assert nvml.initialised == 1
    probe.close()
    probe.close()
    assert nvml.initialised == 0
    with pytest.raises(ProbeError):
        probe.memory_used([0])
