"""On the GPU machine: a verified stop really gives the GPU memory back.

1. ``harvest serve --detach`` of ``transformers serve`` with a random 1B Llama, one chat request,
   ``harvest stop`` -> memory back within the margin of the pre-launch baseline, with timings.
2. A launcher that spawns two CUDA worker processes holding memory is SIGKILLed alone (its workers
   live on, as vLLM's EngineCore does) -> ``harvest stop`` finds and kills both workers and
   measures the memory drained.

Timings are printed as ``BENCH {...}`` lines (run with ``-s``) for BENCHMARKS.md, and written to
``$HARVEST_BENCH_DIR`` when that is set. Skipped, with the reason, where NVML sees no GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest import http
from harvest.gpu import open_probe
from harvest.server import StateFile
from harvest.server.stop import DEFAULT_MARGIN_MIB
from tests.engines import free_port
from tests.server.helpers import gone, wait_for

pytestmark = pytest.mark.gpu

HARVEST = [sys.executable, "-m", "harvest.cli.main"]

WORKER = """
import os, sys, time, torch
x = torch.empty(4 * 1024**3, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
with open(os.path.join(sys.argv[1], "w%s.ready" % sys.argv[2]), "w") as fh:
    fh.write(str(os.getpid()))
time.sleep(600)
"""

LAUNCHER = """
import http.server, os, subprocess, sys, time
port, folder = int(sys.argv[1]), sys.argv[2]
workers = [subprocess.Popen([sys.executable, "-c", sys.argv[3], folder, str(i)]) for i in range(2)]
deadline = time.monotonic() + 300
while not all(os.path.exists(os.path.join(folder, "w%d.ready" % i)) for i in range(2)):
    if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
        sys.exit("launcher: a CUDA worker failed to start")
    time.sleep(0.2)
"""

#: The tail of a launcher script: answer GET /health with 200 on ``port`` for up to 15 minutes.
SERVE_HEALTH = """
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", port), Health)
server.timeout = 0.5
end = time.monotonic() + 900
while time.monotonic() < end:
    server.handle_request()
"""
LAUNCHER += SERVE_HEALTH


def bench(name: str, data: dict) -> None:
    line = json.dumps({"bench": name, **data})
    print("BENCH " + line)
    out = os.environ.get("HARVEST_BENCH_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(line + "\n")


def toml_list(values: list[str]) -> str:
    return json.dumps(values)


def write_config(path: Path, server_lines: list[str]) -> Path:
    path.write_text("[server]\n" + "\n".join(server_lines) + "\n[preflight]\nmin_disk_free_gib = 1\n")
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


def harvest(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HARVEST, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def used_mib(gpu: int) -> int:
    probe = open_probe()
    try:
        return probe.memory_used([gpu])[gpu]
    finally:
        probe.close()


def stop_and_check(env: dict[str, str], run_dir: Path) -> dict:
    out = harvest(env, "stop", str(run_dir), "--json", timeout=300)
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "clean", doc
    (report,) = doc["servers"]  # harvest.stop/1: one report per server
    assert out.returncode == 0, out.stdout + out.stderr
    assert report["verdict"] == "clean", report
    for gpu, final in report["final_mib"].items():
        assert final <= report["baseline_mib"][gpu] + DEFAULT_MARGIN_MIB, report
    assert not [h for h in report["holders"] if h["ours"]]
    return report


def test_transformers_serve_1b_stop_gives_memory_back(tmp_path, env, gpu_model_1b):
    model = gpu_model_1b
    port = free_port()
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "server.toml", [
        'engine = "transformers"', f"model = {json.dumps(str(model))}", f"python = {json.dumps(sys.executable)}",
        f"port = {port}", "gpus = [0]", 'dtype = "bfloat16"', "ready_timeout = 600", "stop_grace = 20",
        "stop_deadline = 120"])
    t = time.monotonic()
    served = harvest(env, "serve", str(cfg), "--run-dir", str(run_dir), "--detach")
    ready_s = time.monotonic() - t
    assert served.returncode == 0, served.stdout + served.stderr[-4000:]
    try:
        rec = StateFile(run_dir).read().record
        assert rec.gpus == (0,) and 0 in rec.baseline_mib
        assert used_mib(0) > rec.baseline_mib[0] + 1024  # the server really holds memory
        body = {"model": str(model), "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 16}
        r = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300)
        assert r.status == 200, r.text
        held_mib = used_mib(0)
    finally:
        t = time.monotonic()
        report = stop_and_check(env, run_dir)
    stop_s = time.monotonic() - t
    assert gone(rec.pid, rec.create_time)
    steps = {s["name"]: s["duration_s"] for s in report["steps"]}
    bench("transformers-1b-stop", {"serve_to_ready_s": round(ready_s, 2), "held_mib": held_mib,
                                   "baseline_mib": report["baseline_mib"], "final_mib": report["final_mib"],
                                   "stop_total_s": report["total_s"], "stop_cli_wall_s": round(stop_s, 2),
                                   "steps_s": steps, "escalated": report["escalated"]})


def test_launcher_sigkilled_alone_then_stop_kills_its_cuda_workers(tmp_path, env):
    folder = tmp_path / "workers"
    folder.mkdir()
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    port = free_port()
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "server.toml", [
        'engine = "command"',
        "command = " + toml_list([sys.executable, str(script), "{port}", str(folder), WORKER]),
        'health_url = "http://{host}:{port}/health"', f"port = {port}", "gpus = [0]", "ready_timeout = 300",
        "stop_grace = 10", "stop_deadline = 60"])
    served = harvest(env, "serve", str(cfg), "--run-dir", str(run_dir), "--detach")
    assert served.returncode == 0, served.stdout + served.stderr[-4000:]
    rec = StateFile(run_dir).read().record
    workers = [int((folder / f"w{i}.ready").read_text()) for i in range(2)]
    worker_ct = {pid: psutil.Process(pid).create_time() for pid in workers}
    held = used_mib(0)
    assert held >= rec.baseline_mib[0] + 2 * 4096 * 0.9  # both workers hold their 4 GiB

    os.kill(rec.pid, signal.SIGKILL)  # the launcher alone, by its recorded pid (this test started it)
    wait_for(lambda: gone(rec.pid, rec.create_time), 10, "the launcher to die")
    assert not any(gone(pid, ct) for pid, ct in worker_ct.items())  # orphaned, still holding memory
    assert used_mib(0) >= rec.baseline_mib[0] + 2 * 4096 * 0.9

    t = time.monotonic()
    report = stop_and_check(env, run_dir)
    wall = time.monotonic() - t
    assert all(gone(pid, ct) for pid, ct in worker_ct.items())
    steps = {s["name"]: s["duration_s"] for s in report["steps"]}
    bench("orphaned-cuda-workers-stop", {"held_mib": held, "baseline_mib": report["baseline_mib"],
                                         "final_mib": report["final_mib"], "stop_total_s": report["total_s"],
                                         "stop_cli_wall_s": round(wall, 2), "steps_s": steps,
                                         "escalated": report["escalated"]})
