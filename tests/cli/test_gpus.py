"""`harvest gpus`: the table, the no-driver line, and --json against docs/json-schema.md."""

from __future__ import annotations

import os

import psutil
import pytest
from click.testing import CliRunner

import harvest.placement.local as local_placement
from harvest.cli.main import cli
from harvest.gpu import NvmlProbe
from tests.gpu.fake_nvml import NVML_ERROR_GPU_IS_LOST, FakeGpu, FakeNvml, unused_pid
from tests.gpu.schema_doc import documented_schema, only_answer, problems

SCHEMA = documented_schema("harvest.gpus/1")


def invoke(*args: str):
    return CliRunner().invoke(cli, ["gpus", *args], env={"COLUMNS": "200"})


@pytest.fixture
def fake_machine(monkeypatch):
    """`harvest gpus` measuring two fake H200s through the NVML seam; GPU 0 holds two processes."""
    me, ghost = os.getpid(), unused_pid()
    nvml = FakeNvml([
        FakeGpu(uuid="GPU-aaaa", used_mib=41500, utilization=87, processes=[(me, 40960), (ghost, None)]),
        FakeGpu(uuid="GPU-bbbb", utilization=None),
    ])
    # this machine's GPUs are measured by the local placement (harvest gpus asks it)
    monkeypatch.setattr(local_placement, "open_probe", lambda **_: NvmlProbe(nvml, host_pid_namespace=True))
    return nvml, me, ghost


def test_this_machine_shows_host_memory_and_gpu_state():
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "host RAM:" in result.output and "swap:" in result.output
    snap = only_answer(invoke("--json").stdout)
    if snap["source"] == "none":
        assert "GPUs: no NVIDIA driver found" in result.output
        assert "Traceback" not in result.output
    else:
        assert snap["gpus"] and snap["gpus"][0]["name"] in result.output


def test_json_on_this_machine_matches_the_documented_schema():
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    doc = only_answer(result.stdout)
    assert problems(doc, SCHEMA) == []
    host = psutil.virtual_memory()
    assert doc["host"]["ram_total_mib"] == host.total // 2**20


def test_table_lists_gpus_and_names_processes(fake_machine):
    _, me, ghost = fake_machine
    result = invoke()
    assert result.exit_code == 0, result.output
    out = result.output
    assert "GPUs (nvml, driver 550.54.15)" in out
    assert "NVIDIA H200" in out and "41500 / 143771" in out and "87%" in out and "n/a" in out
    assert f"pid {me} {psutil.Process(me).name()} 40960 MiB" in out
    assert f"pid {ghost} (not visible in this pid namespace) MiB unknown" in out


def test_json_with_gpus_matches_the_documented_schema(fake_machine):
    _, me, ghost = fake_machine
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    doc = only_answer(result.stdout)
    assert problems(doc, SCHEMA) == []
    assert doc["source"] == "nvml" and doc["unavailable_reason"] is None
    g0, g1 = doc["gpus"]
    assert (g0["used_mib"], g0["reserved_mib"], g0["free_mib"]) == (41500, 615, 143771 - 615 - 41500)
    assert g0["processes"] == [
        {"pid": me, "name": psutil.Process(me).name(), "used_mib": 40960, "visible": True},
        {"pid": ghost, "name": None, "used_mib": None, "visible": False},
    ]
    assert g1["utilization_pct"] is None and g1["processes"] == []


def test_watch_prints_one_document_per_refresh(fake_machine):
    nvml, _, _ = fake_machine
    result = invoke("--json", "--watch", "0.1", "--count", "3")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert problems(only_answer(line), SCHEMA) == []
    assert nvml.initialised == 0  # the probe was closed


def test_a_failing_measurement_exits_1_with_the_error(fake_machine):
    nvml, _, _ = fake_machine
    nvml.fail[("nvmlDeviceGetComputeRunningProcesses", 1)] = NVML_ERROR_GPU_IS_LOST
    result = invoke()
    assert result.exit_code == 1
    assert "GPU is lost" in result.output and "GPU 1" in result.output


def test_bad_watch_interval_is_a_usage_error():
    assert invoke("--watch", "0").exit_code == 2
