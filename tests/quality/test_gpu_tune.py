"""On the GPU machine: ``harvest tune`` over ``transformers serve`` knobs with a random 1B Llama.

The grid: dtype (bfloat16, the reference, against float16) and continuous-batching flags passed
through ``extra_args`` (the memory fraction and the batch-token budget, under the names this
transformers build's ``serve --help`` lists). ``transformers serve`` has chat completions only and
no prompt logprobs, so the quality probe is free-running greedy (as text) and the report says so;
it has no ``/metrics``, so throughput is from usage. Every launch must end with a clean StopReport
before the next. The table is printed with a ``BENCH`` prefix (run with ``-s``) for BENCHMARKS.md,
and written to ``$HARVEST_BENCH_DIR/tune-transformers-1b.txt`` when that is set. Skipped, with the
reason, where NVML sees no GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from harvest.campaign.sweep.tune_file import parse_tune_file
from tests.placed import tune
from harvest.cli.tune import tune_table
from harvest.config import parse_config
from tests.engines import free_port

pytestmark = pytest.mark.gpu



def serve_flags() -> str:
    out = subprocess.run([sys.executable, "-m", "transformers.cli.transformers", "serve", "--help"],
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_transformers_serve_grid_under_the_quality_gate(tmp_path, monkeypatch, gpu_model_1b):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    model = gpu_model_1b
    flags = serve_flags()
    memory_flag = next((f for f in ("--cb-memory-fraction", "--cb-max-memory-percent") if f in flags), None)
    assert memory_flag is not None, "serve --help lists no continuous-batching memory flag"
    assert "--cb-max-batch-tokens" in flags

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"g{i}",
                                        "prompt": f"Write about topic {i} for a while."}) + "\n"
                            for i in range(256)))
    job = parse_config({
        "server": {"engine": "transformers", "model": str(model), "python": sys.executable,
                   "port": free_port(),
                   "gpus": [0], "dtype": "bfloat16", "ready_timeout": 900, "stop_grace": 20,
                   "stop_deadline": 120},
        "preflight": {"min_disk_free_gib": 1},
        "data": {"path": str(data), "id_field": "id"},
        "sampling": {"max_tokens": 128},
        "output": {"dir": str(tmp_path / "run")},
    }, source=str(tmp_path / "job.toml"))
    tune_file = parse_tune_file({
        "grid": [{"dtype": ["bfloat16", "float16"]},
                 {"extra_args": [[memory_flag, "0.5"], ["--cb-max-batch-tokens", "512"]]}],
        "probe": {"prompts": 24, "max_tokens": 48, "concurrency": 12, "request_timeout": 600},
        "throughput": {"prompts": 96, "concurrency": 48, "max_tokens": 128},
    })
    report = asyncio.run(tune(job, tune_file))

    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=240, file=sink)
        console.print(tune_table(report))
    table = console.export_text()
    for line in table.splitlines():
        print("BENCH " + line)
    for t in report.trials:
        tp, q = t.throughput, (t.quality.metrics() if t.quality else {})
        print("BENCH " + json.dumps({
            "bench": "tune-transformers-1b", "trial": t.index, "settings": t.overrides, "verdict": t.verdict,
            "reasons": list(t.reasons), "gen_tok_s": tp.gen_tok_s if tp else None,
            "ready_s": t.launch.ready_s if t.launch else None,
            "stop_s": t.launch.stop.total_s if t.launch and t.launch.stop else None,
            "exact_match": q["exact_match"].value if "exact_match" in q else None}))
    out = os.environ.get("HARVEST_BENCH_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "tune-transformers-1b.txt").write_text(table)
        (Path(out) / "tune-transformers-1b.json").write_text(json.dumps(report.to_dict(), indent=1))

    assert [t.index for t in report.trials] == [1, 2, 3, 4]
    for launch in report.launches:
        assert launch.stop is not None and launch.stop.clean, (launch.label, launch.stop)
    ref = report.trials[0]
    assert ref.is_reference and ref.verdict == "pass", ref.reasons
    assert ref.quality.teacher_forced is None and any("no prompt logprobs" in n for n in ref.quality.notes)
    for t in report.trials:
        if t.verdict in ("pass", "fail"):
            assert t.throughput is not None and t.throughput.failed == 0 and t.throughput.gen_tok_s > 0
    assert report.best is not None
    assert (report.out_dir / "tune.csv").exists() and (report.out_dir / "tune.json").exists()
