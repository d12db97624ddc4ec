"""The shared real vLLM CPU server answers a chat completion with the fixture's tiny model."""

from __future__ import annotations

import pytest

from harvest import http

pytestmark = pytest.mark.engine


def test_chat_completion_through_real_vllm(vllm_server):
    body = {"model": vllm_server.model, "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 8, "temperature": 0}
    r = http.post(vllm_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    assert choice["finish_reason"] in ("length", "stop")
    assert data["usage"]["completion_tokens"] >= 1
    assert isinstance(choice["message"]["content"], str)
    metrics = http.get(vllm_server.url + "/metrics", timeout=10).text
    assert "vllm:" in metrics
