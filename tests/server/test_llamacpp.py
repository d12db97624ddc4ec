"""llama.cpp's llama-server with more requests in flight than slots does not exit on SIGTERM (a real
fault of the engine, seen with build 11434). ``harvest stop`` must escalate to SIGKILL inside its
deadline, say so in the StopReport, and leave nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading

import pytest

from harvest import http
from harvest.config import ServerConfig
from harvest.net import port_listening
from tests import harvest_process
from tests.server.helpers import gone, wait_for
from tests.timing import SLACK_S

pytestmark = pytest.mark.engine


def _gauge(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", metrics, re.MULTILINE)
    return float(m.group(1)) if m else -1.0


def test_llama_server_ignoring_sigterm_with_requests_in_flight_is_escalated(llama_server_bin, tiny_gguf, launcher):
    def config(port: int) -> ServerConfig:
        return ServerConfig(engine="llamacpp", model=str(tiny_gguf), command=[llama_server_bin], port=port,
                            max_running_requests=2, extra_args=["--threads", "1"], ready_timeout=120.0,
                            stop_grace=3.0, stop_deadline=12.0)

    server = launcher.launch(config)
    rec = server.state().record
    assert rec.engine_version  # llama-server --version answered
    assert server.kv_capacity_tokens is not None and server.kv_capacity_tokens > 0

    errors: list[str] = []

    def generate() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 100000, "ignore_eos": True, "stream": True}
        try:
            http.post(server.url + "/v1/completions", json=body, timeout=120)
        except http.HttpError as exc:  # the server goes away under us: expected
            errors.append(type(exc.__cause__).__name__)

    clients = [threading.Thread(target=generate, daemon=True) for _ in range(8)]
    for c in clients:
        c.start()

    def in_flight() -> bool:
        try:  # a busy server on a loaded machine may answer a scrape late: not yet, not a failure
            text = http.get(server.url + "/metrics", timeout=10).text
        except http.HttpError:
            return False
        return (_gauge(text, server.adapter.metrics.running) >= 2
                and _gauge(text, server.adapter.metrics.waiting) >= 1)

    wait_for(in_flight, 60, "requests processing and deferred", interval=0.2)

    out = harvest_process.run([sys.executable, "-m", "harvest.cli.main", "stop", str(server.run_dir), "--json"],
                              capture_output=True, text=True, timeout=60, env=dict(os.environ))
    doc = json.loads(out.stdout)
    (report,) = doc["servers"]  # harvest.stop/1: one report per server

    assert out.returncode == 0, out.stdout + out.stderr
    assert doc["verdict"] == "clean"
    assert report["escalated"] is True
    steps = {s["name"]: s for s in report["steps"]}
    assert "still alive" in steps["grace"]["outcome"]
    assert "sigkill" in steps and steps["reap"]["ok"] is True
    assert report["verdict"] == "clean"
    assert report["total_s"] <= rec.stop_deadline + SLACK_S
    assert gone(rec.pid, rec.create_time)
    assert not port_listening("127.0.0.1", rec.port)
    for c in clients:
        c.join(30)
    assert errors  # the streams were cut, not finished
