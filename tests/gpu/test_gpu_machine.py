"""On a machine with an NVIDIA GPU: `harvest gpus` sees it, and `harvest preflight --wait` fails
while a process this test started holds ~40 GB, naming it, then passes once that process exits.

Needs NVML and PyTorch with CUDA; skipped elsewhere with the reason. The holder is started with
start_new_session and stopped by its own pid only.
"""

from __future__ import annotations

import os
import re
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvest.gpu import NvmlProbe
from harvest.gpu.host import in_host_pid_namespace
from tests.gpu.schema_doc import only_answer

pytestmark = pytest.mark.gpu

HOLD_GIB = 40
SLACK_GIB = 20  # the config's claim fits with this much to spare when the GPU is idle
HOLDER = """
import sys, time, torch
x = torch.empty(int(sys.argv[1]) * 2**30, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print("READY", flush=True)
deadline = time.monotonic() + float(sys.argv[2])  # never outlives a broken test by much
while time.monotonic() < deadline:
    time.sleep(0.1)
"""


def _nvml_probe() -> NvmlProbe:
    try:
        return NvmlProbe()
    except Exception as exc:  # any failure to open NVML means there is no GPU to test here
        pytest.skip(f"needs an NVIDIA GPU (NVML): {exc}")


def harvest(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harvest.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "250"})


def _wait_for_line(proc: subprocess.Popen, expected: str, timeout: float) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5) and proc.stdout.readline().strip() == expected:
                return True
            if proc.poll() is not None:
                return False
    finally:
        sel.close()
    return False


def test_gpus_json_sees_the_gpu():
    _nvml_probe().close()
    result = harvest("gpus", "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    doc = only_answer(result.stdout)  # checked against the documented harvest.gpus/2 and its answer
    assert doc["source"] == "nvml" and len(doc["gpus"]) >= 1
    assert all(g["total_mib"] > 0 and g["used_mib"] + g["free_mib"] <= g["total_mib"] for g in doc["gpus"])
    table = harvest("gpus", timeout=60)
    print(table.stdout)
    assert table.returncode == 0 and doc["gpus"][0]["name"] in table.stdout


def test_preflight_fails_while_a_holder_runs_and_passes_after_it_exits(tmp_path: Path):
    probe = _nvml_probe()
    try:
        pytest.importorskip("torch", reason="needs PyTorch to hold GPU memory")
        gpu = probe.snapshot().gpus[0]
        if gpu.processes:
            pytest.skip(f"GPU 0 is not idle (compute processes: {gpu.processes}); the test needs it to itself")
        if gpu.free_mib < (HOLD_GIB + SLACK_GIB + 4) * 1024:
            pytest.skip(f"GPU 0 has {gpu.free_mib} MiB free; the test needs {HOLD_GIB + SLACK_GIB + 4} GiB")
        # Claim what fits now with SLACK_GIB to spare, so holding HOLD_GIB must make it fail.
        fraction = int((gpu.free_mib - 1024 - SLACK_GIB * 1024) / gpu.total_mib * 1000) / 1000
        with socket.socket() as s:  # a port for the config; the check binds it and lets it go again
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = tmp_path / "sglang.toml"
        cfg.write_text(
            f'[server]\nengine = "sglang"\nmodel = "unused"\ngpus = [0]\nport = {port}\n'
            f"mem_fraction_static = {fraction}\n"
            # This test is about the GPU: host rules it does not control are relaxed.
            "[preflight]\nmin_disk_free_gib = 0\nmax_swap_used_mib = 100000000\n"
            f'[output]\ndir = "{tmp_path / "out"}"\n')
        clean = harvest("preflight", str(cfg), timeout=60)
        assert clean.returncode == 0, clean.stdout + clean.stderr

        env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
        waiting: subprocess.Popen | None = None
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(HOLD_GIB), "600"], stdout=subprocess.PIPE,
                                  text=True, env=env, start_new_session=True)
        try:
            assert _wait_for_line(holder, "READY", timeout=180), "the holder did not allocate in time"
            deadline = time.monotonic() + 30
            while probe.memory_used([0])[0] < gpu.used_mib + HOLD_GIB * 1024 and time.monotonic() < deadline:
                time.sleep(0.1)

            held = harvest("preflight", str(cfg), "--wait", "5", timeout=120)
            print(held.stdout)
            assert held.returncode == 1, held.stdout + held.stderr
            lines = held.stdout.splitlines()
            assert any(line.startswith("FAIL  gpu-memory") and "GPU 0" in line for line in lines), held.stdout
            proc_lines = [line for line in lines if line.startswith("FAIL  gpu-processes")]
            assert proc_lines, held.stdout
            procs = proc_lines[-1]
            if in_host_pid_namespace() is not False:
                found = re.search(rf"pid {holder.pid} \S+ (\d+) MiB", procs)
            else:  # in a container the driver's pid may be another namespace's: then it is said so
                found = re.search(rf"pid (?:{holder.pid} \S+|\d+ \(not visible in this pid namespace\)) (\d+) MiB",
                                  procs)
            assert found, procs
            assert int(found.group(1)) >= HOLD_GIB * 1024

            waiting = subprocess.Popen([sys.executable, "-m", "harvest.cli.main", "preflight", str(cfg),
                                        "--wait", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env={**os.environ, "COLUMNS": "250"})
            time.sleep(2)  # it is polling, and failing, while the holder still runs
            assert waiting.poll() is None, "preflight ended while the holder still held memory"
            holder.terminate()  # the process this test started, by its pid
            holder.wait(timeout=60)
            out, err = waiting.communicate(timeout=90)
            print(out)
            assert waiting.returncode == 0, out + err
            (summary,) = [line for line in out.splitlines() if line.startswith("waited ")]
            found = re.fullmatch(r"waited ([\d.]+) s \((\d+) checks\): passed", summary)
            assert found, summary
            # It failed at least once (the holder still ran), then passed well within --wait.
            assert int(found.group(2)) > 1 and float(found.group(1)) < 30
        finally:
            for started in (holder, waiting):  # only what this test started, each by its pid
                if started is not None and started.poll() is None:
                    started.kill()
                    started.wait(timeout=60)
    finally:
        probe.close()
