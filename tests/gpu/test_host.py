"""Host measurements (psutil) and matching driver-reported pids to processes here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import psutil

from harvest.gpu import disk_state, host_state
from harvest.gpu.host import in_host_pid_namespace, nearest_existing, resolve_gpu_pid
from tests.gpu.fake_nvml import unused_pid


def test_host_state_matches_psutil():
    state = host_state()
    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    assert state.ram_total_mib == vm.total // 2**20
    assert 0 < state.ram_available_mib <= state.ram_total_mib
    assert abs(state.ram_available_mib - vm.available // 2**20) < 2048  # measured a moment apart
    assert state.swap_total_mib == sw.total // 2**20
    assert 0 <= state.swap_used_mib <= max(state.swap_total_mib, 1)


def test_disk_state_of_a_missing_folder_is_its_nearest_existing_parent(tmp_path):
    state = disk_state(tmp_path / "run" / "not" / "created")
    assert state.path == str(tmp_path)
    assert not (tmp_path / "run").exists()  # measuring creates nothing
    usage = shutil.disk_usage(tmp_path)
    assert state.total_mib == usage.total // 2**20
    assert abs(state.free_mib - usage.free // 2**20) < 1024
    assert nearest_existing(tmp_path) == tmp_path


def test_resolve_pid_in_the_host_namespace():
    me = os.getpid()
    assert resolve_gpu_pid(me, host_namespace=True) == (True, psutil.Process(me).name())
    assert resolve_gpu_pid(unused_pid(), host_namespace=True) == (False, None)


def test_resolve_pid_in_a_nested_namespace_needs_an_nvidia_device_open():
    # A process that holds no /dev/nvidia* file is not the GPU process the driver reported.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert resolve_gpu_pid(child.pid, host_namespace=False) == (False, None)
        assert resolve_gpu_pid(child.pid, host_namespace=True)[0] is True
    finally:
        child.kill()  # by its pid: the process this test started
        child.wait(timeout=10)
    assert resolve_gpu_pid(child.pid, host_namespace=True) == (False, None)


def test_pid_namespace_is_measured():
    with open("/proc/self/status") as f:
        nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), None)
    measured = in_host_pid_namespace()
    if nspid is not None and len(nspid) > 1:  # this process is visible from an outer namespace
        assert measured is False
    assert measured in (True, False)
