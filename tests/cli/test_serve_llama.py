"""The server commands of docs/campaign.md on a real engine, as a user types them: ``harvest preflight``,
``harvest serve --detach``, ``harvest ps`` and ``harvest stop`` on llama.cpp's llama-server and the
tiny GGUF model. Outcomes are measured: the engine answers a completion, ``ps`` lists it, and after
``stop`` its process is gone (pid with create time) and its port closed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harvest import http
from harvest.net import port_listening
from harvest.server import RunStatus, StateFile
from tests import harvest_process
from tests.engines import free_port
from tests.server.helpers import gone

pytestmark = pytest.mark.engine

HARVEST = [sys.executable, "-m", "harvest"]


def harvest(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([*HARVEST, *args], env=env, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)


def test_preflight_serve_ps_stop_on_llama_server(tmp_path: Path, llama_server_bin: str, tiny_gguf: Path):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state"), "LLAMA_ARG_THREADS": "1"}
    for _ in range(4):  # a port taken between choosing it and the engine binding it: choose again
        port = free_port()
        cfg = tmp_path / f"llama-{port}.toml"
        cfg.write_text(
            "[server]\n"
            'engine = "llamacpp"\n'
            f"model = {json.dumps(str(tiny_gguf))}\n"
            f"command = {json.dumps([llama_server_bin])}\n"
            f"port = {port}\n"
            "max_running_requests = 2\n"
            'extra_args = ["-c", "1024"]\n'
            "ready_timeout = 120\n"
            "stop_grace = 5\n"
            "[preflight]\n"
            "min_disk_free_gib = 0.05\n")
        pre = harvest(env, "preflight", str(cfg), "--json")
        if pre.returncode == 1 and f"port {port}" in pre.stdout:
            continue
        assert pre.returncode == 0, pre.stdout + pre.stderr
        doc = json.loads(pre.stdout)
        assert doc["passed"] and all(r["passed"] for r in doc["places"][0]["answer"]["results"]), doc
        run_dir = tmp_path / f"run-{port}"
        served = harvest(env, "serve", str(cfg), "--detach", "--run-dir", str(run_dir))
        if served.returncode != 0 and "in use" in served.stdout + served.stderr:
            continue
        break
    assert served.returncode == 0, served.stdout + served.stderr
    state = StateFile(run_dir).read()
    assert state.status is RunStatus.READY
    rec = state.record
    try:
        answer = http.post(f"http://127.0.0.1:{port}/v1/completions",
                           json={"prompt": "Once upon a time", "max_tokens": 4}, timeout=60).json()
        assert answer["choices"][0]["text"] is not None

        listed = json.loads(harvest(env, "ps", "--json").stdout)
        [row] = listed["servers"]
        assert row["pid"] == rec.pid and row["port"] == port and row["recorded"]["status"] == "ready"
        assert row["measured"]["leader_alive"] is True and row["measured"]["port_listening"] is True
    finally:
        stopped = harvest(env, "stop", str(run_dir), "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    (report,) = json.loads(stopped.stdout)["servers"]
    assert report["verdict"] == "clean"
    assert gone(rec.pid, rec.create_time)
    assert not port_listening("127.0.0.1", port)
    assert json.loads(harvest(env, "ps", "--json").stdout)["servers"] == []
