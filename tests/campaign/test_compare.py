"""``harvest compare`` on the tiny model with vLLM's CPU build: the reference against a second launch
of itself (the noise floor) and candidates chosen by what this CPU can run (tests/capabilities.py):
with AVX-512 or AMX an FP8 KV cache and float32 weights-and-activations; without, the FP8 KV cache
(which the engine refuses here: recorded "unsupported", the comparison goes on) and float32.

One comparison for the vLLM tests (four launches); every test reads its report. The
policy test reuses the stored reference and floor, so it launches nothing.
A last test runs a comparison over the deterministic chat stand-in (tests/quality/chat_engine.py)
where one candidate's stop is dirty.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harvest.campaign.sweep.compare import CompareReport
from tests import harvest_process
from tests.placed import compare
from harvest.config import load_config, parse_config
from harvest.quality.evaluate import gate
from harvest.quality.settings import GateSettings, ProbeSettings, QualitySettings
from tests import engines
from tests.capabilities import CpuFeatures, compare_candidates

CPU = CpuFeatures.read()
CANDIDATES = compare_candidates(CPU)
LABELS = {c.name: f"candidate-{i + 1}" for i, c in enumerate(CANDIDATES)}
MEASURED = [c for c in CANDIDATES if c.expect == "measured"]
UNSUPPORTED = [c for c in CANDIDATES if c.expect == "unsupported"]

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"
# The shared comparison (four vLLM launches) is set up inside the first test that asks for
# it; on a busy two-core machine one launch alone can take minutes.
pytestmark = pytest.mark.timeout(3000)

PROBE = ProbeSettings(prompts=16, max_tokens=32)
TIGHT = GateSettings(top1_margin=0.0, kl_factor=1.0, kl_abs_min=0.0, delta_factor=1.0, delta_abs_min=0.0,
                     exact_match_margin=0.0)


def write_job(path: Path, *, model: Path, python: str, port: int, data: Path, extra: str = "") -> Path:
    env = "\n".join(f'{k} = "{v}"' for k, v in engines.VLLM_ENV.items())
    path.write_text(f"""
[server]
engine = "vllm"
model = {json.dumps(str(model))}
python = {json.dumps(python)}
served_model_name = "tiny"
port = {port}
extra_args = ["--max-model-len", "2048", "--enforce-eager"]
ready_timeout = 600
stop_grace = 20
stop_deadline = 90
{extra}

[server.env]
{env}

[preflight]
min_disk_free_gib = 0.05

[data]
path = {json.dumps(str(data))}
id_field = "id"
""")
    return path


@pytest.fixture(scope="module")
def compared(tmp_path_factory, vllm_python, tiny_model):
    root = tmp_path_factory.mktemp("compare")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}",
                                        "prompt": f"Describe thing number {i} in detail."}) + "\n"
                            for i in range(64)))
    port = engines.free_port()
    print(f"CPU: {CPU.describe()}; compare candidates: "
          + ", ".join(f"{c.name} ({c.expect})" for c in CANDIDATES))
    jobs = {name: write_job(root / f"{name}.toml", model=tiny_model, python=vllm_python, port=port, data=data,
                            extra=extra)
            for name, extra in (("ref", ""), *((c.name, c.server) for c in CANDIDATES))}
    jobs.setdefault("fp8", write_job(root / "fp8.toml", model=tiny_model, python=vllm_python, port=port,
                                     data=data, extra='kv_cache_dtype = "fp8"'))  # the policy test's
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARVEST_STATE_DIR", str(root / "state"))
        report = asyncio.run(compare(load_config(jobs["ref"]),
                                     [load_config(jobs[c.name]) for c in CANDIDATES],
                                     settings=QualitySettings(probe=PROBE), out_dir=out))
    return report, jobs, root


def rows(report: CompareReport) -> dict:
    return {r.label: r for r in report.rows}


@pytest.mark.engine
@pytest.mark.slow
def test_every_launch_stopped_clean_before_the_next(compared):
    report, _, _ = compared
    assert [x.label for x in report.launches] == ["reference", "floor", *LABELS.values()]
    refused = {LABELS[c.name] for c in UNSUPPORTED}
    for launch in report.launches:
        assert (launch.error is None) == (launch.label not in refused), launch
        assert launch.stop is not None and launch.stop.clean, launch.stop
        assert (Path(launch.run_dir) / "server.log").exists()
    assert report.all_stops_clean and report.prompts == 16


@pytest.mark.engine
@pytest.mark.slow
def test_reference_against_itself_passes_at_the_noise_floor(compared):
    report, _, _ = compared
    floor = rows(report)["floor"]
    assert report.floor_source == "second launch"
    assert floor.verdict == "pass", floor.reasons
    m = floor.quality.metrics()
    assert m["top1_agreement"].value >= 0.95
    assert m["mean_kl"].value <= 1e-3 and m["mean_abs_delta_logprob"].value <= 1e-2
    assert m["exact_match"].value >= 0.75
    assert floor.quality.teacher_forced.positions == 16 * 32
    assert floor.quality.greedy_unit == "tokens" and floor.quality.errors == ()
    print("BENCH compare-floor " + json.dumps(floor.quality.to_dict()["metrics"]))


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("name", [c.name for c in MEASURED])  # chosen by the CPU probe
def test_candidates_differ_measurably_and_a_tight_gate_rejects_them(compared, name):
    report, _, _ = compared
    label = LABELS[name]
    floor, row = rows(report)["floor"].quality.metrics(), rows(report)[label]
    m = row.quality.metrics()
    # measurably different: the candidate's interval lies above the floor's
    assert m["mean_kl"].low > floor["mean_kl"].high
    assert m["mean_abs_delta_logprob"].low > floor["mean_abs_delta_logprob"].high
    assert m["exact_match"].value < floor["exact_match"].value
    tight = gate(row.quality, rows(report)["floor"].quality, TIGHT)
    assert not tight.passed
    assert {"mean_kl", "mean_abs_delta_logprob"} <= {c.name for c in tight.failures}
    # the verdict recorded with the default gate, and the settings that made the difference
    # under the default gate the verdict is what these metrics against this floor give, recomputed here
    default = gate(row.quality, rows(report)["floor"].quality, GateSettings())
    assert row.gate is not None and row.gate.passed == default.passed
    assert row.verdict == ("pass" if default.passed else "fail"), (row.verdict, default)
    assert row.settings == next(c.settings for c in CANDIDATES if c.name == name)
    print(f"BENCH compare-{label} {row.settings} verdict={row.verdict} "
          + json.dumps(row.quality.to_dict()["metrics"]))


@pytest.mark.engine
@pytest.mark.slow
def test_kv_cache_capacity_follows_the_bytes_per_token(compared):
    """float32 holds half the bfloat16 reference's tokens in the same space; an FP8 cache more."""
    report, _, _ = compared
    launches = {x.label: x for x in report.launches}
    reference = launches["reference"].kv_capacity_tokens
    assert reference > 0
    assert launches[LABELS["f32"]].kv_capacity_tokens < reference
    if "fp8" in [c.name for c in MEASURED]:
        assert launches[LABELS["fp8"]].kv_capacity_tokens > reference


@pytest.mark.engine
@pytest.mark.slow
def test_a_setting_the_engine_refuses_here_is_unsupported_and_the_comparison_goes_on(compared):
    report, _, _ = compared
    by = rows(report)
    if not UNSUPPORTED:
        # This CPU runs every candidate (AVX-512 or AMX): none is refused, each is launched and
        # measured. The refusal itself is shown on every machine by the stand-in printing vLLM's
        # own message (test_the_engines_refusal_at_start_is_unsupported_and_the_next_is_measured).
        assert all(by[LABELS[c.name]].verdict != "unsupported" and by[LABELS[c.name]].quality is not None
                   for c in CANDIDATES), (CPU.describe(), [(r.label, r.verdict) for r in report.rows])
        return
    for cand in UNSUPPORTED:
        row = by[LABELS[cand.name]]
        assert row.verdict == "unsupported", row
        assert row.launch.reason == "unsupported" and row.quality is None
        assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in row.reasons[0]
        assert row.launch.stop is not None and row.launch.stop.clean
    # the candidate after it was launched and measured
    after = [c for c in CANDIDATES[CANDIDATES.index(UNSUPPORTED[-1]) + 1:] if c.expect == "measured"]
    assert after and all(by[LABELS[c.name]].quality is not None for c in after)
    assert not report.passed


@pytest.mark.engine
@pytest.mark.slow
def test_policy_rejects_fp8_without_launching_it(compared):
    report, jobs, root = compared
    out = root / "out"
    settings = root / "tune.toml"
    settings.write_text(f'[probe]\nprompts = {PROBE.prompts}\nmax_tokens = {PROBE.max_tokens}\n\n'
                        '[policy]\nforbid = ["kv_cache_dtype=fp8*"]\n')
    launches_before = sorted(p.name for p in (out / "launches").iterdir())
    env = {**os.environ, "HARVEST_STATE_DIR": str(root / "state-policy")}
    argv = ["compare", "--reference", str(jobs["ref"]), "--candidate", str(jobs["fp8"]),
            "--settings", str(settings), "--out", str(out), "--json"]
    proc = harvest_process.run([sys.executable, "-m", "harvest.cli.main", *argv],
                               capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a candidate did not pass
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "harvest.compare/1" and doc["reused_reference"] is True
    assert doc["launches"] == []
    cand = next(r for r in doc["rows"] if r["label"] == "candidate-1")
    assert cand["verdict"] == "rejected" and cand["launch"] is None
    assert "kv_cache_dtype=fp8 (forbid kv_cache_dtype=fp8*)" in cand["reasons"]
    assert sorted(p.name for p in (out / "launches").iterdir()) == launches_before  # no new launch folder
    # nothing was registered as launched (the state dir is checked, and held, before any launch)
    assert not list((root / "state-policy" / "runs").glob("*")) if (root / "state-policy").exists() else True


def stand_in_jobs(tmp_path: Path):
    """``job(*flags)``: a job over 12 prompts whose server is the chat stand-in with ``flags``."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"d{i}", "prompt": f"Item {i}?"}) + "\n" for i in range(12)))

    def job(*flags: str):
        return parse_config({
            "server": {"engine": "command", "port": engines.free_port(), "ready_timeout": 30, "stop_grace": 2,
                       "stop_deadline": 5, "health_url": "http://{host}:{port}/health",
                       "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}",
                                   *flags]},
            "preflight": {"min_disk_free_gib": 0.05},
            "data": {"path": str(data), "id_field": "id"}})
    return job


def test_the_engines_refusal_at_start_is_unsupported_and_the_next_is_measured(tmp_path, monkeypatch):
    """vLLM's CPU build refusing an FP8 KV cache without AVX-512, as its start-up prints it (the
    stand-in's --unsupported, verbatim from cpu_attn.py; the command adapter is given vLLM's
    unsupported patterns), on any CPU: "unsupported", stopped clean, and the candidate after it is
    measured."""
    from harvest.server.base import COMMON_FATAL
    from harvest.server.engines.command import CommandAdapter
    from harvest.server.engines.vllm import UNSUPPORTED as VLLM_UNSUPPORTED

    monkeypatch.setattr(CommandAdapter, "fatal_patterns", VLLM_UNSUPPORTED + COMMON_FATAL)
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    job = stand_in_jobs(tmp_path)
    report = asyncio.run(compare(
        job(), [job("--unsupported"), job("--perturb", "1")],
        settings=QualitySettings(probe=ProbeSettings(prompts=6, max_tokens=8)), out_dir=tmp_path / "out"))
    by = rows(report)
    refused = by["candidate-1"]
    assert refused.verdict == "unsupported" and refused.launch.reason == "unsupported", refused
    assert refused.quality is None and "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in refused.reasons[0]
    assert refused.launch.stop is not None and refused.launch.stop.clean
    assert by["candidate-2"].quality is not None and by["candidate-2"].verdict == "fail"  # measured after it
    assert not report.passed


def test_a_dirty_stop_fails_its_candidate_and_nothing_further_is_launched(tmp_path, monkeypatch):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    escaped = tmp_path / "escaped.pid"
    job = stand_in_jobs(tmp_path)

    try:
        report = asyncio.run(compare(
            job(), [job("--escape", "120", "--escape-pid-file", str(escaped)), job("--perturb", "1")],
            settings=QualitySettings(probe=ProbeSettings(prompts=6, max_tokens=8)), out_dir=tmp_path / "out"))
    finally:
        if escaped.exists():  # the stand-in's escaped worker: this test's own stray, by its recorded pid
            pid = int(escaped.read_text())
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if abs(p.create_time() - escaped.stat().st_mtime) < 5:
                    p.kill()
    by = rows(report)
    assert by["floor"].verdict == "pass"
    assert by["candidate-1"].verdict == "failed" and by["candidate-1"].reasons[0].startswith("dirty stop")
    assert by["candidate-1"].quality is not None  # measured, but its setting leaves a process behind
    assert by["candidate-2"].verdict == "not run" and by["candidate-2"].launch is None
    assert [x.label for x in report.launches] == ["reference", "floor", "candidate-1"]
    assert not report.all_stops_clean and report.launches[-1].stop.port_open
    assert any("not clean" in n for n in report.notes)
    assert not report.passed
