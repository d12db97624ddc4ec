"""SmiProbe on captured nvidia-smi text (including [N/A]) and run_command on real subprocesses."""

from __future__ import annotations

import os
import sys
import time

import pytest

from harvest.errors import NoDriverError, ProbeError
from harvest.gpu import SmiProbe
from harvest.gpu.smi import parse_apps, parse_gpus, run_command
from tests.gpu.fake_nvml import unused_pid

# Captured from an 8-GPU machine (trimmed to three GPUs); GPU 2 reports no utilization.
GPU_CSV = """\
0, GPU-5e2c7d0a-1111-2222-3333-444455556666, NVIDIA H200, 143771, 41850, 101306, 37
1, GPU-6f3d8e1b-1111-2222-3333-444455556666, NVIDIA H200, 143771, 0, 143156, 0
2, GPU-7a4e9f2c-1111-2222-3333-444455556666, NVIDIA A100-SXM4-80GB, 81920, 4, 81037, [N/A]
"""
APPS_CSV = """\
GPU-5e2c7d0a-1111-2222-3333-444455556666, {me}, python3, 40960
GPU-5e2c7d0a-1111-2222-3333-444455556666, {ghost}, /usr/bin/python3, [N/A]
"""


class CannedSmi:
    """A runner that answers nvidia-smi queries with captured text and records every call."""

    def __init__(self, gpus: str = GPU_CSV, apps: str = "", driver: str = "550.54.15\n"):
        self.answers = {"--query-gpu=driver_version": driver, "--query-compute-apps": apps,
                        "--query-gpu=index,memory.used": "\n".join(
                            ", ".join((r.split(", ")[0], r.split(", ")[4])) for r in gpus.splitlines()),
                        "--query-gpu=index,uuid": gpus}
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv, timeout):
        self.calls.append((list(argv), timeout))
        for key, text in self.answers.items():
            if any(a.startswith(key) for a in argv):
                return text
        raise AssertionError(f"unexpected argv {argv}")


def test_parse_gpus_with_na_utilization():
    rows = parse_gpus(GPU_CSV)
    assert rows[0] == (0, "GPU-5e2c7d0a-1111-2222-3333-444455556666", "NVIDIA H200", 143771, 41850, 101306, 37)
    assert rows[2][2] == "NVIDIA A100-SXM4-80GB" and rows[2][6] is None


def test_parse_keeps_commas_inside_names():
    (row,) = parse_gpus("0, GPU-x, NVIDIA Thing, Rev 2, 1000, 10, 990, 5\n")
    assert row[2] == "NVIDIA Thing, Rev 2" and row[3:] == (1000, 10, 990, 5)
    (app,) = parse_apps("GPU-x, 12, /opt/a,b/python, 7\n")
    assert app == ("GPU-x", 12, "/opt/a,b/python", 7)


def test_parse_na_memory_is_an_error_naming_the_gpu():
    with pytest.raises(ProbeError) as info:
        parse_gpus("3, GPU-x, NVIDIA H200, 143771, [N/A], 100, 0\n")
    assert info.value.gpu == 3 and "memory.used" in str(info.value)


def test_parse_informational_lines_mean_no_rows():
    assert parse_gpus("No devices were found\n") == []
    assert parse_apps("") == []


def test_snapshot_maps_processes_to_gpus_and_marks_unknown():
    me, ghost = os.getpid(), unused_pid()
    runner = CannedSmi(apps=APPS_CSV.format(me=me, ghost=ghost))
    probe = SmiProbe(runner, host_pid_namespace=True, timeout_s=3.0)
    snap = probe.snapshot()
    assert snap.source == "nvidia-smi" and snap.driver_version == "550.54.15"
    assert [g.index for g in snap.gpus] == [0, 1, 2]
    assert snap.gpus[0].used_mib == 41850 and snap.gpus[0].reserved_mib is None
    procs = {p.pid: p for p in snap.gpus[0].processes}
    assert procs[me].visible and procs[me].used_mib == 40960
    assert not procs[ghost].visible and procs[ghost].name is None and procs[ghost].used_mib is None
    assert snap.gpus[1].processes == ()
    assert snap.gpus[2].utilization_pct is None
    assert any("nvidia-smi" in w for w in snap.warnings)
    # Every call went through the runner with a finite timeout.
    assert runner.calls and all(t == 3.0 for _, t in runner.calls)
    assert any("--format=csv,noheader,nounits" in argv for argv, _ in runner.calls)


def test_memory_used_and_unknown_index():
    probe = SmiProbe(CannedSmi(), host_pid_namespace=True)
    assert probe.memory_used([2, 0]) == {2: 4, 0: 41850}
    with pytest.raises(ProbeError) as info:
        probe.memory_used([5])
    assert info.value.gpu == 5


def test_closed_probe_raises():
    probe = SmiProbe(CannedSmi(), host_pid_namespace=True)
    probe.close()
    probe.close()
    with pytest.raises(ProbeError):
        probe.snapshot()


def test_run_command_times_out_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(ProbeError) as info:
        run_command([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert time.monotonic() - start < 10
    assert "timed out" in str(info.value)


def test_run_command_missing_binary_and_no_driver_exit_codes():
    with pytest.raises(NoDriverError):
        run_command(["harvest-no-such-nvidia-smi"], 5)
    for code in (9, 12):  # nvidia-smi: driver not loaded / NVML library not found
        with pytest.raises(NoDriverError):
            run_command([sys.executable, "-c", f"import sys; sys.exit({code})"], 10)
    with pytest.raises(ProbeError) as info:
        run_command([sys.executable, "-c", "import sys; print('GPU lost', file=sys.stderr); sys.exit(15)"], 10)
    assert not isinstance(info.value, NoDriverError)
    assert "exit code 15" in str(info.value) and "GPU lost" in str(info.value)


def test_smi_probe_without_nvidia_smi_is_no_driver():
    with pytest.raises(NoDriverError):
        SmiProbe(executable="harvest-no-such-nvidia-smi")
