"""On the GPU machine: a tensor-parallel-style engine over every GPU, its launcher SIGKILLed alone.

Through ``harvest serve`` with the ``command`` engine, a launcher starts one torch.distributed rank
per GPU (NCCL, each holding 8 GiB and running an all-reduce loop). The ranks start their own
sessions, as some engines' workers do, so the process-group signal cannot reach them: only the
descendants harvest recorded can. The test SIGKILLs the launcher alone (by the pid in the launch
record), then:

- ``harvest preflight`` on those GPUs refuses, naming each GPU, the orphaned rank's pid and MiB;
- ``harvest stop`` finds every rank through the recorded descendants, kills it, and verifies every
  GPU back within the margin of its pre-launch baseline;
- ``harvest preflight`` passes again.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Timings are printed as ``BENCH`` lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import psutil
import pytest

from harvest.server import StateFile
from tests.engines import free_port
from tests.server.helpers import gone, wait_for
from tests.server.test_gpu import (  # noqa: F401  (env is a fixture)
    SERVE_HEALTH,
    bench,
    env,
    harvest,
    stop_and_check,
    toml_list,
    write_config,
)

pytestmark = pytest.mark.gpu

RANK = """
import os, sys, time, torch, torch.distributed as dist
rank, world, folder, master_port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port)
torch.cuda.set_device(rank)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
hold = torch.empty(8 * 1024**3, dtype=torch.uint8, device="cuda")
hold.fill_(1)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
with open(os.path.join(folder, "rank%d.ready" % rank), "w") as fh:
    fh.write(str(os.getpid()))
end = time.monotonic() + 900
while time.monotonic() < end:
    dist.all_reduce(x)
    torch.cuda.synchronize()
    time.sleep(0.05)
"""

LAUNCHER = """
import http.server, os, subprocess, sys, time
port, folder, world, master_port, rank_code = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
ranks = [subprocess.Popen([sys.executable, "-c", rank_code, str(r), str(world), folder, master_port], env=env,
                          start_new_session=True) for r in range(world)]
deadline = time.monotonic() + 300
while not all(os.path.exists(os.path.join(folder, "rank%d.ready" % r)) for r in range(world)):
    if time.monotonic() > deadline or any(p.poll() is not None for p in ranks):
        sys.exit("launcher: a rank failed to start")
    time.sleep(0.2)
""" + SERVE_HEALTH


def _gpu_count() -> int:
    from harvest.gpu import open_probe

    probe = open_probe()
    try:
        return len(probe.snapshot().gpus)
    finally:
        probe.close()


def test_orphaned_ranks_on_every_gpu_are_found_and_cleared(tmp_path, env):  # noqa: F811
    world = _gpu_count()
    gpus = list(range(world))
    folder = tmp_path / "ranks"
    folder.mkdir()
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    port = free_port()
    run_dir = tmp_path / "run"
    server_lines = [
        'engine = "command"',
        "command = " + toml_list([sys.executable, str(launcher), "{port}", str(folder), str(world),
                                  str(free_port()), RANK]),
        'health_url = "http://{host}:{port}/health"', f"port = {port}", f"gpus = {gpus}", f"tp = {world}",
        "ready_timeout = 300", "stop_grace = 10", "stop_deadline = 90"]
    cfg = write_config(tmp_path / "server.toml", server_lines)
    t = time.monotonic()
    served = harvest(env, "serve", str(cfg), "--run-dir", str(run_dir), "--detach")
    ready_s = time.monotonic() - t
    assert served.returncode == 0, served.stdout + served.stderr[-4000:]
    rec = StateFile(run_dir).read().record
    ranks = {int((folder / f"rank{r}.ready").read_text()): r for r in range(world)}
    created = {pid: psutil.Process(pid).create_time() for pid in ranks}
    for pid in ranks:  # the ranks left the launcher's process group: only the records can find them
        assert os.getpgid(pid) != rec.pgid
    # The recorder has seen every rank before the launcher dies (it records every ~2 s).
    wait_for(lambda: set(ranks) <= {d.pid for d in StateFile(run_dir).read().descendants}, 15,
             "every rank in the recorded descendants")

    os.kill(rec.pid, signal.SIGKILL)  # the launcher alone, by its recorded pid
    wait_for(lambda: gone(rec.pid, rec.create_time), 10, "the launcher to die")
    assert not any(gone(pid, ct) for pid, ct in created.items()), "the ranks must outlive the launcher"

    # A second config that wants the same GPUs: preflight names every orphaned rank and refuses.
    probe_cfg = write_config(tmp_path / "next.toml", [
        'engine = "sglang"', 'model = "next-model"', f"port = {free_port()}", f"gpus = {gpus}", f"tp = {world}",
        "mem_fraction_static = 0.5"])
    refused = harvest(env, "preflight", str(probe_cfg))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    for pid, rank in ranks.items():
        assert re.search(rf"GPU {rank}\b.*pid {pid}\b.*\d+ MiB", refused.stdout), refused.stdout

    t = time.monotonic()
    report = stop_and_check(env, run_dir)
    wall = time.monotonic() - t
    assert all(gone(pid, ct) for pid, ct in created.items())
    assert set(report["final_mib"]) == {str(g) for g in gpus}

    passed = harvest(env, "preflight", str(probe_cfg), "--wait", "30")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    bench(f"orphaned-ranks-{world}gpu-stop", {
        "world": world, "serve_to_ready_s": round(ready_s, 2), "baseline_mib": report["baseline_mib"],
        "final_mib": report["final_mib"], "stop_total_s": report["total_s"], "stop_cli_wall_s": round(wall, 2),
        "steps_s": {s["name"]: s["duration_s"] for s in report["steps"]}, "escalated": report["escalated"],
        "preflight_refusal": [line for line in refused.stdout.splitlines() if "FAIL" in line]})
    print(json.dumps(report, indent=1))
