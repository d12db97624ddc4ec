"""On the GPU machine: `harvest run` with a managed ``transformers serve`` (a random 1B Llama whose
config.json declares 4096 positions) and a dataset holding one 800 KB prompt (the issue's case: it
kept 128 requests in flight at 0 tok/s for minutes, then came back as an answered item).

``transformers serve`` reports no context length and has no ``/tokenize``: the limit comes from the
model folder's config.json and the prompt is counted by the character bound
(campaign/run/context.py). The oversized item is skipped with its length and the limit, never sent;
every other item completes. The run's wall time is printed as a ``BENCH`` line (run with ``-s``)
and written to ``$HARVEST_BENCH_DIR`` when that is set. Skipped, with the reason, where NVML sees
no GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Ledger, Status
from tests.engines import free_port

pytestmark = pytest.mark.gpu

PROMPTS = 64
HUGE_BYTES = 800_000


def test_managed_transformers_serve_skips_the_prompt_larger_than_the_context(tmp_path, monkeypatch, gpu_model_1b):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    model = gpu_model_1b
    context = json.loads((model / "config.json").read_text())["max_position_embeddings"]

    data = tmp_path / "prompts.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"Write a few lines about topic {i}."} for i in range(PROMPTS)]
    rows.insert(PROMPTS // 2, {"id": "huge", "prompt": ("lorem ipsum dolor sit amet " * (HUGE_BYTES // 27))})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = parse_config({
        "server": {"engine": "transformers", "model": str(model), "python": sys.executable, "port": free_port(),
                   "gpus": [0], "dtype": "bfloat16", "ready_timeout": 900, "stop_grace": 20, "stop_deadline": 120},
        "preflight": {"min_disk_free_gib": 1},
        "data": {"path": str(data)},  # no id_field: the rows' own "id" is used
        "sampling": {"max_tokens": 64},
        "client": {"concurrency": 64, "request_timeout": 600},
        "output": {"dir": str(tmp_path / "run")},
    }, source=str(tmp_path / "job.toml"))

    t = time.monotonic()
    report = asyncio.run(run_campaign(job))
    wall_s = time.monotonic() - t

    assert report.outcome == "finished", report.note
    assert report.totals.ok, report.totals.describe()
    assert all(stop.clean for stop in report.stop_reports)
    counts = report.totals.counts
    assert counts[Status.SKIPPED] == 1 and counts[Status.FAILED] == 0
    assert counts[Status.DONE] + counts[Status.TRUNCATED] == PROMPTS
    ledger = Ledger.open_readonly(tmp_path / "run")
    try:
        huge = ledger.get("huge")
    finally:
        ledger.close()
    assert huge is not None and huge.status is Status.SKIPPED and huge.attempts == 0
    assert huge.error_class == "context_length"
    assert huge.last_error.endswith(f"+ max_tokens 64 does not fit the model's context of {context} tokens "
                                    f"(llama-1b/config.json)"), huge.last_error
    line = json.dumps({"bench": "transformers-1b-context-skip", "items": PROMPTS + 1, "wall_s": round(wall_s, 1),
                       "skip_reason": huge.last_error})
    print("BENCH " + line)
    out = os.environ.get("HARVEST_BENCH_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "transformers-1b-context-skip.json").write_text(line + "\n")
