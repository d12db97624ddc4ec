"""The quality wire on ``transformers serve`` 5.17 on the CPU (the tiny model), as the GPU machine's
tune test drives it on a 1B model: ``harvest tune`` of one trial (the reference), and ``harvest
compare`` of one candidate (bfloat16 against the job's float32) without a floor launch. This version
has chat completions only and no prompt log-probabilities: the probe is free-running greedy, scored
as text, and the report says so; it has no ``/metrics``, so throughput comes from the answers' usage.
Every launch ends with a clean verified stop before the next.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from harvest.campaign.sweep.tune_file import parse_tune_file
from tests import harvest_process
from tests.placed import tune
from harvest.config import parse_config
from tests.engines import free_port

pytestmark = pytest.mark.slow


def tables(tmp_path: Path, model: Path, python: str, name: str, **server: object) -> dict:
    data = tmp_path / "prompts.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"id": f"g{i}", "prompt": f"Write about topic {i}."}) + "\n"
                                for i in range(48)))
    return {
        "server": {"engine": "transformers", "model": str(model), "python": python, "port": free_port(),
                   "dtype": "float32", "ready_timeout": 300, "stop_grace": 15, "stop_deadline": 60,
                   # On the CPU its paged cache takes this share of the host's RAM (most of it by default).
                   "gpu_memory_utilization": 0.02, **server},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(data), "id_field": "id"},
        "sampling": {"max_tokens": 16},
        "output": {"dir": str(tmp_path / name)},
    }


def write_toml(path: Path, doc: dict) -> Path:
    lines = []
    for name, table in doc.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_one_tune_trial_through_the_quality_wire(tmp_path, monkeypatch, transformers_python, tiny_model):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    job = parse_config(tables(tmp_path, tiny_model, transformers_python, "run"), source=str(tmp_path / "job.toml"))
    tune_file = parse_tune_file({
        "grid": {"dtype": ["float32"]},
        "probe": {"prompts": 8, "max_tokens": 12, "concurrency": 8, "request_timeout": 120, "floor_launch": False},
        "throughput": {"prompts": 32, "concurrency": 16, "max_tokens": 16},
    })
    report = asyncio.run(tune(job, tune_file))

    assert [t.index for t in report.trials] == [1]
    assert [launch.stop is not None and launch.stop.clean for launch in report.launches] == [True]
    ref = report.trials[0]
    assert ref.is_reference and ref.verdict == "pass", ref.reasons
    assert ref.quality is not None and ref.quality.teacher_forced is None
    assert any("no prompt logprobs" in n for n in ref.quality.notes), ref.quality.notes
    assert ref.throughput is not None and ref.throughput.failed == 0 and ref.throughput.gen_tok_s > 0
    assert report.best is not None and (report.out_dir / "tune.json").exists()


def test_one_compare_through_the_quality_wire(tmp_path, transformers_python, tiny_model):
    reference = write_toml(tmp_path / "reference.toml", tables(tmp_path, tiny_model, transformers_python, "ref"))
    candidate = write_toml(tmp_path / "candidate.toml",
                           tables(tmp_path, tiny_model, transformers_python, "cand", dtype="bfloat16"))
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    got = harvest_process.run([sys.executable, "-m", "harvest", "compare", "--reference", str(reference),
                          "--candidate", str(candidate), "--probe", "8", "--no-floor", "--json"],
                              capture_output=True, text=True, timeout=600, env=env)
    # Exit 0 when the candidate passes the gate, 1 when it does not: both are a comparison made.
    assert got.returncode in (0, 1), got.stdout[-3000:] + got.stderr[-3000:]
    doc = json.loads(got.stdout)
    assert doc["schema"] == "harvest.compare/1" and doc["prompts"] == 8
    assert [launch["stop"]["verdict"] for launch in doc["launches"]] == ["clean", "clean"], doc["launches"]
    assert all(launch["error"] is None for launch in doc["launches"]), doc["launches"]
    rows = {row["label"]: row for row in doc["rows"]}
    cand = [row for label, row in rows.items() if label != "floor"]
    assert len(cand) == 1 and cand[0]["verdict"] in ("pass", "fail"), doc["rows"]
    assert (got.returncode == 0) == (cand[0]["verdict"] == "pass")
    quality = cand[0]["quality"]
    assert quality["prompts"] == 8 and quality["errors"] == [], quality
    assert quality["greedy_unit"] == "characters" and quality["metrics"]["exact_match"]["n"] == 8, quality
    assert any("no prompt logprobs" in n for n in quality["notes"]), quality["notes"]
