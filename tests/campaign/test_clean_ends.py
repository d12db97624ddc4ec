"""Every way `harvest run` ends leaves nothing for asyncio or aiohttp to complain about.

Each exit path on a real llama-server, with everything harvest wrote read back: finished,
interrupted (SIGINT while generating, as Ctrl-C), down (the endpoint killed, past health_deadline)
and hung (``tests/hang_engine.py`` holding completions, /metrics absent so that
``concurrency = "auto"`` steers by canaries, the requests that hang included). None may print
"Task exception was never retrieved", "Unclosed client session", "Unclosed connector", "Task was
destroyed but it is pending", "was never awaited" or "Exception ignored"; the interpreter runs with
``-X dev`` (asyncio's debug mode and every ResourceWarning shown) so a leak is printed, not hidden.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import engines, harvest_process
from tests.campaign.ledger_peek import results_count
from tests.campaign.test_give_up import PREFLIGHT, data
from tests.hosts.conftest import write_toml

pytestmark = [pytest.mark.engine, pytest.mark.slow]

NOISE = ("Task exception was never retrieved", "Unclosed client session", "Unclosed connector",
         "Task was destroyed but it is pending", "was never awaited", "Exception ignored", "ResourceWarning")
HANG_ENGINE = Path(engines.ROOT) / "tests" / "hang_engine.py"


def run(job: Path, tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    return harvest_process.popen([sys.executable, "-X", "dev", "-m", "harvest", "run", str(job), "--no-live"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_results(run_dir: Path, proc: subprocess.Popen[str], at_least: int) -> None:
    deadline = time.monotonic() + 120
    while results_count(run_dir) < at_least:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"fewer than {at_least} results within 120 s"
        time.sleep(0.05)


def assert_quiet(out: str) -> None:
    found = [line for line in out.splitlines() if any(n in line for n in NOISE)]
    assert not found, "\n".join(found) + "\n---\n" + out[-6000:]
    assert "Traceback" not in out, out


def managed_job(tmp_path: Path, llama: str, gguf: Path, command: list[str] | None = None, **client: object) -> Path:
    return write_toml(tmp_path / "job.toml", {
        "server": {"engine": "llamacpp", "model": str(gguf), "command": command or [llama],
                   "port": engines.free_port(),
                   "max_running_requests": 4, "extra_args": ["-c", "8192"], "stop_grace": 2},
        "preflight": PREFLIGHT, "data": {"path": str(data(tmp_path)), "id_field": "id"},
        "sampling": {"max_tokens": 16}, "client": dict(client), "output": {"dir": str(tmp_path / "run")}})


def test_finished_run_ends_quietly(tmp_path, llama_server_bin, tiny_gguf):
    proc = run(managed_job(tmp_path, llama_server_bin, tiny_gguf), tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert_quiet(out)


@pytest.mark.parametrize("when", ["launching", "generating"])
def test_interrupted_run_ends_quietly(tmp_path, llama_server_bin, tiny_gguf, when):
    # launching: llama-server behind a pause standing for a large model's load
    command = ["sh", "-c", 'sleep 5; exec "$0" "$@"', llama_server_bin] if when == "launching" else None
    proc = run(managed_job(tmp_path, llama_server_bin, tiny_gguf, command=command), tmp_path)
    try:
        if when == "launching":
            deadline = time.monotonic() + 60
            while not (tmp_path / "run" / "server" / "launch.json").exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
                time.sleep(0.05)
        else:
            wait_results(tmp_path / "run", proc, 20)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert_quiet(out)


def test_down_run_ends_quietly(tmp_path, llama_server_bin, tiny_gguf):
    port = engines.free_port()
    server = engines.start_engine(engines.llama_argv(llama_server_bin, str(tiny_gguf), port), port=port,
                                  model=str(tiny_gguf), log_path=tmp_path / "llama.log", health="/health", timeout=60)
    job = write_toml(tmp_path / "job.toml", {
        "data": {"path": str(data(tmp_path)), "id_field": "id"}, "sampling": {"max_tokens": 16},
        "client": {"endpoints": [server.url], "health_deadline": 4}, "output": {"dir": str(tmp_path / "run")}})
    proc = run(job, tmp_path)
    try:
        wait_results(tmp_path / "run", proc, 20)
        server.stop(grace=0)
        out, _ = proc.communicate(timeout=180)
    finally:
        server.stop(grace=0)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 1, out
    assert_quiet(out)


def test_hung_run_ends_quietly(tmp_path, llama_server_bin, tiny_gguf):
    port = engines.free_port()
    argv = [sys.executable, str(HANG_ENGINE), "--hang-after", "20", "--no-metrics", "--",
            *engines.llama_argv(llama_server_bin, str(tiny_gguf), port)]
    server = engines.start_engine(argv, port=port, model=str(tiny_gguf), log_path=tmp_path / "engine.log",
                                  health="/health", timeout=60)
    job = write_toml(tmp_path / "job.toml", {
        "data": {"path": str(data(tmp_path)), "id_field": "id"}, "sampling": {"max_tokens": 16},
        # hung for longer than a canary may take (60 s): one that timed out on the hung endpoint is
        # never read by the steering again, and must not be left for asyncio to report
        "client": {"endpoints": [server.url], "health_deadline": 45}, "output": {"dir": str(tmp_path / "run")}})
    proc = run(job, tmp_path)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        server.stop(grace=0)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 1, out
    assert "hung: no answer for" in out, out
    assert_quiet(out)
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["state"] == "server_down"
