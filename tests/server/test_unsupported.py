"""An engine's "not supported on this machine" is its own launch failure (``unsupported``), found
before the traceback around it would call it a crash; compare/tune report it as a problem of the
setting. The log below is the shape vLLM 0.32.0's CPU build writes (lines verbatim from
``vllm/v1/attention/backends/cpu_attn.py``) when asked for an FP8 KV cache without AVX-512."""

from __future__ import annotations

import pytest

from harvest.campaign.sweep.compare import row_from
from harvest.campaign.sweep.launch import Launch, judge
from harvest.server import adapter_for
from harvest.server.readiness import first_fatal

VLLM_FP8_ON_AVX2 = """\
INFO 12-01 02:10:11 [core.py:96] Initializing a V1 LLM engine (v0.32.0) with config: model='tiny'
ERROR 12-01 02:10:19 [core.py:843] EngineCore failed to start.
ERROR 12-01 02:10:19 [core.py:843] Traceback (most recent call last):
ERROR 12-01 02:10:19 [core.py:843]   File "vllm/v1/attention/backends/cpu_attn.py", line 541, in _get_attn_isa
ERROR 12-01 02:10:19 [core.py:843] NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


@pytest.mark.parametrize("line", [
    "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
    "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU.",
    "NotImplementedError: Sparse Attention is not supported on CPU.",
])
def test_vllm_unsupported_lines(line):
    hit = first_fatal(f"INFO starting\n{line}\n", adapter_for("vllm").fatal_patterns)
    assert hit is not None and hit[0].reason == "unsupported" and hit[1] == line


def test_unsupported_wins_over_the_traceback_and_engine_core_lines_around_it():
    pattern, line = first_fatal(VLLM_FP8_ON_AVX2, adapter_for("vllm").fatal_patterns)
    assert pattern.reason == "unsupported"
    assert line.endswith("NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.")
    # without that line the same log is a crash
    crash = VLLM_FP8_ON_AVX2.replace("NotImplementedError: FP8 KV cache on CPU requires", "ValueError: x")
    assert first_fatal(crash, adapter_for("vllm").fatal_patterns)[0].reason == "fatal_log"


def test_an_unsupported_launch_is_judged_unsupported_for_compare_and_tune():
    error = "vLLM does not support this setting on this machine during start-up: NotImplementedError: ..."
    launch = Launch("candidate-1", "/x", error=error, reason="unsupported")
    judged = judge(launch, None)  # the one judgement both sweeps use
    assert judged.verdict == "unsupported" and judged.reasons == (f"not supported on this machine: {error}",)
    row = row_from("candidate-1", {"kv_cache_dtype": "fp8"}, launch, None)
    assert row.verdict == "unsupported" and row.reasons == judged.reasons
    crashed = row_from("candidate-2", {}, Launch("candidate-2", "/y", error="boom", reason="fatal_log"), None)
    assert crashed.verdict == "failed"
