"""The real thing: vLLM's CPU build with the tiny model, launched, used and stopped by harvest.

One launch only (the machine's cores are shared): launch -> ready -> one chat completion -> stop,
then measured: every recorded process gone, nothing left in the process group, the port closed,
the StopReport clean.
"""

from __future__ import annotations

import os

import psutil
import pytest

from harvest import http
from harvest.config import ServerConfig
from harvest.net import port_listening
from harvest.server import RunStatus
from tests.engines import VLLM_ENV
from tests.server.helpers import gone, wait_for
from tests.timing import SLACK_S

pytestmark = pytest.mark.engine


def _group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


@pytest.mark.vllm
def test_vllm_cpu_launch_ready_chat_stop(vllm_python, tiny_model, launcher):
    def config(port: int) -> ServerConfig:
        return ServerConfig(engine="vllm", model=str(tiny_model), python=vllm_python, port=port,
                            served_model_name="tiny", max_running_requests=8, env=dict(VLLM_ENV),
                            extra_args=["--max-model-len", "2048", "--enforce-eager"], ready_timeout=600.0,
                            stop_grace=20.0, stop_deadline=90.0)

    server = launcher.launch(config, record_interval=1.0)
    state = server.state()
    rec = state.record
    assert state.status is RunStatus.READY
    assert rec.engine_version == "0.32.0"
    assert server.kv_capacity_tokens is not None and server.kv_capacity_tokens > 0
    assert state.kv_capacity_tokens == server.kv_capacity_tokens

    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8,
            "temperature": 0}
    r = http.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    metrics = http.get(server.url + "/metrics", timeout=30).text
    for name in (server.adapter.metrics.running, server.adapter.metrics.waiting, server.adapter.metrics.kv_usage):
        assert f"\n{name}{{" in metrics, name

    # vLLM's engine core runs in a child process: the recorder must have seen it.
    wait_for(lambda: server.state().descendants, 10, "descendants to be recorded")
    recorded = server.state().processes()
    assert len(recorded) >= 2

    report = server.shutdown()

    assert report is not None and report.verdict == "clean", report
    assert all(gone(p.pid, p.create_time) for p in recorded)
    assert _group_members(rec.pgid) == []
    assert not port_listening("127.0.0.1", rec.port)
    assert report.total_s <= rec.stop_deadline + SLACK_S
