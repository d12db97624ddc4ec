"""The line a launching engine's log shows a person: engine prefixes removed, noise left out."""

from __future__ import annotations

import pytest

from harvest.server.milestones import MAX_CHARS, last_milestone, milestone, strip_prefix

VLLM_LOG = """\
INFO 12-01 02:10:00 [__init__.py:216] Automatically detected platform cpu.
(APIServer pid=1200) INFO 12-01 02:10:01 [api_server.py:1839] vLLM API server version 0.11.0
(EngineCore_DP0 pid=1234) INFO 12-01 02:10:05 [cpu_model_runner.py:100] Starting to load model /m...
(EngineCore_DP0 pid=1234) INFO 12-01 02:10:06 [default_loader.py:267] Loading weights took 0.05 seconds
(EngineCore_DP0 pid=1234) WARNING 12-01 02:10:06 [utils.py:10] FutureWarning: something is deprecated
(EngineCore_DP0 pid=1234) INFO 12-01 02:10:08 [kv_cache_utils.py:1087] GPU KV cache size: 43,680 tokens
(APIServer pid=1200) INFO 12-01 02:10:20 [launcher.py:36] Route: /v1/chat/completions, Methods: POST
"""


def test_the_last_step_of_a_vllm_start_up():
    assert last_milestone(VLLM_LOG) == "GPU KV cache size: 43,680 tokens"
    assert last_milestone(VLLM_LOG.splitlines()[3]) == "Loading weights took 0.05 seconds"


@pytest.mark.parametrize("line, shown", [
    ("[2025-11-30 10:00:00 TP0] Load weight begin. avail mem=78.5 GB", "Load weight begin. avail mem=78.5 GB"),
    ("[2025-11-30 10:00:09 TP3] Capture cuda graph begin. This can take up to several minutes.",
     "Capture cuda graph begin. This can take up to several minutes."),
    ("srv    load_model: loading model '/m/model.gguf'", "loading model '/m/model.gguf'"),
    ("main: server is listening on http://127.0.0.1:8080 - starting the main loop",
     "server is listening on http://127.0.0.1:8080 - starting the main loop"),
    ("INFO:     Application startup complete.", "Application startup complete."),
    ("Loading safetensors checkpoint shards:  10% 1/10\rLoading safetensors checkpoint shards:  50% 5/10",
     "Loading safetensors checkpoint shards:  50% 5/10"),
])
def test_engine_prefixes_are_removed(line, shown):
    assert milestone(line) == shown


@pytest.mark.parametrize("line", ["", "   ", "(APIServer pid=1) INFO 12-01 02:10:20 [launcher.py:36] Route: /health",
                                  "some unrelated output", "UserWarning: TypedStorage is deprecated"])
def test_noise_is_not_a_milestone(line):
    assert milestone(line) is None


def test_long_lines_are_cut_for_the_panel():
    shown = milestone("Loading weights from " + "x" * 500)
    assert shown is not None and len(shown) == MAX_CHARS and shown.endswith("…")
    assert strip_prefix("INFO 12-01 02:10:00 [a.py:1] Loading") == "Loading"
