"""``harvest tune``: the grid, the policy, the memory order, failures and dirty stops, the table.

Two real sweeps:
- a fast one over a deterministic chat server (tests/quality/chat_engine.py run as a ``command``
  engine) that meets every kind of trial: the reference, a degraded setting, a policy rejection, an
  out-of-memory start and the larger setting skipped after it, a dirty stop that ends the sweep;
- the tiny model on vLLM's CPU build through the CLI: a three-trial grid (plus two fp8 settings the
  policy rejects without launching) where one trial's server cannot start, then ``--then-run``
  completes the campaign with the best setting. Four launches: reference (= trial 1), trial 2,
  the failing trial 5 (exits at argument parsing), and the campaign.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.campaign.sweep.tune import expand_grid
from harvest.campaign.sweep.tune_file import parse_tune_file
from tests import harvest_process
from tests.placed import tune
from harvest.config import ServerConfig, parse_config
from harvest.errors import ConfigError
from harvest.ledger import Ledger, Status
from tests import engines

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"


@pytest.fixture(autouse=True)
def harvest_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own index of run folders."""
    d = tmp_path / "state"
    monkeypatch.setenv("HARVEST_STATE_DIR", str(d))
    return d


def _prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Tell me about item {i}."}) + "\n"
                            for i in range(n)))
    return path


# --- the tune file and the grid ------------------------------------------------------------------------


def test_grid_is_the_union_of_cartesian_products_without_repeats():
    base = ServerConfig(engine="sglang", model="m", mem_fraction_static=0.8)
    tf = parse_tune_file({"grid": [{"mem_fraction_static": [0.8, 0.9], "kv_cache_dtype": ["auto", "fp8_e4m3"]},
                                   {"extra_args": [[], ["--enable-hierarchical-cache"]]}]})
    trials = expand_grid(base, tf)
    assert [t.overrides for t in trials] == [
        {"mem_fraction_static": 0.8, "kv_cache_dtype": "auto"},
        {"mem_fraction_static": 0.8, "kv_cache_dtype": "fp8_e4m3"},
        {"mem_fraction_static": 0.9, "kv_cache_dtype": "auto"},
        {"mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3"},
        {"extra_args": []},  # the job's own settings: not the same as kv auto (None != "auto")
        {"extra_args": ["--enable-hierarchical-cache"]}]
    assert trials[3].config.kv_cache_dtype == "fp8_e4m3" and trials[3].config.mem_fraction_static == 0.9
    assert [t.index for t in trials] == [1, 2, 3, 4, 5, 6]
    assert len({t.label for t in trials}) == 6
    single = parse_tune_file({"grid": {"max_running_requests": [8, 8, 16]}})
    assert [t.config.max_running_requests for t in expand_grid(base, single)] == [8, 16]
    sampled = parse_tune_file({"grid": {"max_running_requests": list(range(1, 21))},
                               "sweep": {"max_trials": 5, "sample_seed": 3}})
    picked = [t.config.max_running_requests for t in expand_grid(base, sampled)]
    assert len(picked) == 5 and picked == sorted(picked)
    assert picked == [t.config.max_running_requests for t in expand_grid(base, sampled)]


@pytest.mark.parametrize(("raw", "where"), [
    ({"grid": {"no_such_field": [1]}}, "[grid]"),
    ({"grid": {"mem_fraction_static": 0.9}}, "[grid]"),
    ({"probe": {"top_k": 50}}, "[probe] top_k"),
    ({"policy": {"forbid": ["fp8"]}}, "[policy]"),
    ({"sweep": {"on_dirty_stop": "ignore"}}, "[sweep] on_dirty_stop"),
])
def test_tune_file_errors_name_the_table(raw, where):
    with pytest.raises(ConfigError) as err:
        parse_tune_file(raw, source="tune.toml")
    assert f"tune.toml {where}" in str(err.value)


def test_grid_values_are_validated_as_server_settings():
    base = ServerConfig(engine="sglang", model="m")
    with pytest.raises(ConfigError) as err:
        expand_grid(base, parse_tune_file({"grid": {"mem_fraction_static": [0.5, 1.5]}}, source="t.toml"))
    assert "mem_fraction_static" in str(err.value)


# --- a sweep over the chat stand-in ---------------------------------------------------------------------


def test_sweep_meets_every_kind_of_trial(tmp_path):
    port = engines.free_port()
    escape_pid = tmp_path / "escaped.pid"
    job = parse_config({
        "server": {"engine": "command", "port": port, "max_running_requests": 4,
                   "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"],
                   "health_url": "http://{host}:{port}/health", "ready_timeout": 30, "stop_grace": 2,
                   "stop_deadline": 6},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(_prompts(tmp_path / "in.jsonl", 30)), "id_field": "id"},
        "sampling": {"max_tokens": 8},
        "output": {"dir": str(tmp_path / "run")},
    }, source=str(tmp_path / "job.toml"))
    tf = parse_tune_file({
        "grid": [
            {"extra_args": [[], ["--perturb", "0.7"]]},
            {"kv_cache_dtype": ["fp8"]},
            {"extra_args": [["--oom"]], "max_running_requests": [4, 8]},
            {"extra_args": [["--escape", "120", "--escape-pid-file", str(escape_pid)]]},
            {"extra_args": [["--delay", "0.01"]]},
        ],
        "probe": {"prompts": 10, "max_tokens": 12},
        "policy": {"forbid": ["kv_cache_dtype=fp8*"]},
        "throughput": {"prompts": 20, "concurrency": 8},
    })
    seen = []
    try:
        report = asyncio_run(tune(job, tf, on_trial=seen.append))
    finally:
        _end_escaped(escape_pid)

    verdicts = {t.index: t.verdict for t in report.trials}
    assert verdicts == {1: "pass", 2: "fail", 3: "rejected", 4: "failed", 5: "skipped", 6: "failed",
                        7: "not run"}
    by = {t.index: t for t in report.trials}
    assert by[1].is_reference and by[1].quality.metrics()["exact_match"].value == 1.0
    assert by[1].quality.greedy_unit == "characters" and by[1].quality.teacher_forced is None
    assert any("no prompt logprobs" in n for n in by[1].quality.notes)
    assert any(c.name == "exact_match" for c in by[2].gate.failures)
    assert by[3].launch is None and not (report.out_dir / "trials" / by[3].label).exists()
    assert by[4].launch.reason == "out_of_memory" and by[4].launch.memory_bound
    assert by[5].launch is None and "trial 4" in by[5].reasons[0]
    assert by[6].reasons[0].startswith("dirty stop") and by[6].launch.stop.port_open
    assert by[6].quality is not None  # measured, but its setting leaves a process holding the port
    assert report.aborted and by[7].launch is None
    assert report.floor_source == "second launch"
    assert report.best is not None and report.best.index == 1
    assert by[1].throughput.requests == 20 and by[1].throughput.failed == 0
    assert by[1].throughput.gen_tok_s > 0 and by[1].throughput.completion_tokens == 20 * 8
    assert by[1].throughput.peak_running is None  # no /metrics on this engine

    # every launch but the one that leaves a process behind stopped clean, and it ended the sweep
    labels = [launch.label for launch in report.launches]
    assert labels[:2] == ["reference", "floor"] and labels[-1] == by[6].label
    assert all(launch.stop is not None and launch.stop.clean for launch in report.launches[:-1])
    assert [t.index for t in seen] == [1, 2, 3, 4, 5, 6, 7]

    with open(report.out_dir / "tune.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["verdict"] for r in rows] == [verdicts[i] for i in range(1, 8)]
    doc = json.loads((report.out_dir / "tune.json").read_text())
    assert doc["schema"] == "harvest.tune/1" and doc["best"] == 1 and doc["aborted"] is True

    # A second sweep reuses the stored reference and floors: no reference or floor launch.
    again = asyncio_run(tune(job, parse_tune_file({"grid": {"kv_cache_dtype": ["fp8"]},
                                                   "probe": {"prompts": 10, "max_tokens": 12},
                                                   "policy": {"forbid": ["kv_cache_dtype=fp8*"]}})))
    assert again.reused_reference and again.launches == ()
    assert [t.verdict for t in again.trials] == ["rejected"]


def test_a_reference_that_reproduces_across_launches_and_not_within_one(tmp_path):
    """The reference's rescoring in its own launch differs (an engine whose rerun is not its first
    answer), a second launch matches it: the reference passes as reproduced, a degrading candidate
    still fails against the second launch's floor. Without a second launch the reference's own
    check fails, as ``harvest compare``'s floor row does."""
    def job_for(name: str):
        return parse_config({
            "server": {"engine": "command", "port": engines.free_port(),
                       "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}",
                                   "--rerun-perturb", "0.6"],
                       "health_url": "http://{host}:{port}/health", "ready_timeout": 30, "stop_grace": 2,
                       "stop_deadline": 6},
            "preflight": {"min_disk_free_gib": 0.05},
            "data": {"path": str(_prompts(tmp_path / f"{name}.jsonl", 16)), "id_field": "id"},
            "sampling": {"max_tokens": 8},
            "output": {"dir": str(tmp_path / name)},
        }, source=str(tmp_path / f"{name}.toml"))

    grid = {"extra_args": [[], ["--perturb", "0.7"]]}
    probe = {"prompts": 16, "max_tokens": 8}
    report = asyncio_run(tune(job_for("two"), parse_tune_file({
        "grid": grid, "probe": probe, "throughput": {"prompts": 4, "concurrency": 2}})))
    ref, bad = report.trials
    assert report.floor_source == "second launch"
    assert ref.is_reference and ref.quality.metrics()["exact_match"].value < 0.9  # its rerun differs
    assert ref.verdict == "pass", ref.reasons  # the second launch reproduced it
    assert bad.verdict == "fail" and any(c.name == "exact_match" for c in bad.gate.failures)

    alone = asyncio_run(tune(job_for("one"), parse_tune_file({
        "grid": grid, "probe": {**probe, "floor_launch": False}, "throughput": {"prompts": 4, "concurrency": 2}})))
    ref = alone.trials[0]
    assert alone.floor_source == "same launch" and ref.is_reference
    assert ref.verdict == "fail" and any(c.name == "exact_match" for c in ref.gate.failures), ref.reasons


def _end_escaped(pid_file: Path) -> None:
    """The chat stand-in's escaped worker: this test's own stray, ended by its recorded pid."""
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - pid_file.stat().st_mtime) < 5:  # the process that wrote the file
            p.kill()
            p.wait(10)
    except psutil.Error:
        pass


def asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


# --- the tiny model on vLLM, through the CLI, with --then-run -------------------------------------------


def gate_verdict(trial: dict) -> str:
    """"pass" or "fail" from a trial's recorded gate: each check's value against its limit, read
    here, not from the verdict the sweep wrote."""
    checks = trial["gate"]["checks"]
    assert checks, trial
    for c in checks:
        holds = c["value"] <= c["limit"] + 1e-6 if c["op"] == "<=" else c["value"] >= c["limit"] - 1e-6
        assert holds == c["passed"], c
    return "pass" if all(c["passed"] for c in checks) else "fail"

@pytest.mark.vllm
@pytest.mark.engine
@pytest.mark.slow
def test_vllm_grid_with_a_failing_trial_then_run(tmp_path, vllm_python, tiny_model):
    port = engines.free_port()
    data = _prompts(tmp_path / "in.jsonl", 48)
    job = tmp_path / "job.toml"
    job.write_text(f"""
[server]
engine = "vllm"
model = {json.dumps(str(tiny_model))}
python = {json.dumps(vllm_python)}
served_model_name = "tiny"
port = {port}
kv_cache_dtype = "auto"
max_running_requests = 8
extra_args = ["--max-model-len", "2048", "--enforce-eager"]
ready_timeout = 600
stop_grace = 20
stop_deadline = 90

[server.env]
{chr(10).join(f'{k} = "{v}"' for k, v in engines.VLLM_ENV.items())}

[preflight]
min_disk_free_gib = 0.05

[data]
path = {json.dumps(str(data))}
id_field = "id"

[sampling]
max_tokens = 16

[client]
concurrency = 8
health_deadline = 120

[output]
dir = "run"
""")
    grid = tmp_path / "tune.toml"
    grid.write_text("""
[[grid]]
kv_cache_dtype = ["auto", "fp8"]
max_running_requests = [8]

[[grid]]
extra_args = [["--max-model-len", "2048", "--enforce-eager", "--no-such-flag"]]

[policy]
forbid = ["kv_cache_dtype=fp8*"]

[probe]
prompts = 8
max_tokens = 16
floor_launch = false

# (32 x 128 tokens: long enough, most of a second even on a fast machine, for 0.1 s gauge scrapes to
# land mid-run)
[throughput]
prompts = 32
concurrency = 32
max_tokens = 128
extra_body = { ignore_eos = true }
metrics_interval = 0.1
""")
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    t0 = time.monotonic()
    proc = harvest_process.run([sys.executable, "-m", "harvest.cli.main", "tune", str(job), "--grid", str(grid),
                           "--then-run"], capture_output=True, text=True, env=env, timeout=1500,
                               stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    tune_dir = tmp_path / "run" / "tune"
    doc = json.loads((tune_dir / "tune.json").read_text())
    trials = {t["index"]: t for t in doc["trials"]}
    verdicts = {i: t["verdict"] for i, t in trials.items()}
    # trials: 1 auto/8 (the reference), 2 fp8/8, 3 the bad flag (candidates gated on vLLM against
    # a second launch's floor: tests/campaign/test_compare.py)
    assert verdicts[2] == "rejected"
    assert trials[2]["overrides"] == {"kv_cache_dtype": "fp8", "max_running_requests": 8}
    assert verdicts[3] == "failed" and trials[3]["launch"]["reason"] in ("exited", "fatal_log")
    assert verdicts[1] == "pass" and trials[1]["is_reference"]
    assert verdicts[1] == gate_verdict(trials[1]), trials[1]  # what its recorded gate says, checked here
    # the policy-rejected setting was never launched: no folder, no log
    assert not [p for p in (tune_dir / "trials").iterdir() if p.name.startswith("02-")]
    assert (tune_dir / "trials" / trials[3]["label"] / "server" / "server.log").exists()
    # every launch stopped clean before the next one started (the failing one included)
    assert [x["label"] for x in doc["launches"]] == ["reference", trials[3]["label"]]
    assert all(x["stop"] is not None and x["stop"]["verdict"] == "clean" for x in doc["launches"])
    t1 = trials[1]["throughput"]
    assert t1["kv_capacity_tokens"] > 0 and t1["gen_tok_s"] > 0 and t1["gen_tok_s_metrics"] > 0
    # a peak is what a scrape saw while the requests ran; none may come back in time from a busy
    # server (unknown: tests/quality/test_throughput.py), and on a loaded machine the only one that
    # did may have come before vLLM scheduled a request (0). Never above the batch limit.
    peak = t1["peak_running"]
    assert peak is None or 0 <= peak <= 8, trials[1]
    with open(tune_dir / "tune.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["trial"]) for r in rows] == [1, 2, 3]
    assert "gen tok/s" in proc.stdout and "verdict" in proc.stdout
    best = doc["best"]
    assert best == 1 and verdicts[best] == "pass"

    # --then-run: the campaign ran with the best setting and every item is accounted for
    ledger = Ledger.open_readonly(tmp_path / "run")
    try:
        totals = ledger.check_totals()
        assert totals.ok and totals.counts[Status.TRUNCATED] + totals.counts[Status.DONE] == 48
        job_meta = ledger.meta()["job"]
    finally:
        ledger.close()
    assert job_meta["server"]["max_running_requests"] == 8 and job_meta["server"]["kv_cache_dtype"] == "auto"
    print(f"BENCH tune-vllm-cpu wall_s={wall:.1f} " + json.dumps(
        {i: {"verdict": t["verdict"], "tok_s": (t["throughput"] or {}).get("gen_tok_s"),
             "kv": (t["throughput"] or {}).get("kv_capacity_tokens")} for i, t in trials.items()}))


# --- a setting the engine cannot run on this machine ------------------------------------------------------


def test_an_unsupported_setting_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """A trial whose engine says "not supported on this machine" (the chat stand-in prints vLLM's
    own FP8-on-AVX2 refusal; the command adapter is given vLLM's unsupported patterns) is
    "unsupported", not a crash, is not taken for a memory failure, and the next trial runs."""
    from harvest.server.base import COMMON_FATAL
    from harvest.server.engines.command import CommandAdapter
    from harvest.server.engines.vllm import UNSUPPORTED

    monkeypatch.setattr(CommandAdapter, "fatal_patterns", UNSUPPORTED + COMMON_FATAL)
    job = parse_config({
        "server": {"engine": "command", "port": engines.free_port(), "max_running_requests": 4,
                   "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"],
                   "health_url": "http://{host}:{port}/health", "ready_timeout": 30, "stop_grace": 2,
                   "stop_deadline": 6},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(_prompts(tmp_path / "in.jsonl", 12)), "id_field": "id"},
        "sampling": {"max_tokens": 8},
        "output": {"dir": str(tmp_path / "run")},
    }, source=str(tmp_path / "job.toml"))
    tf = parse_tune_file({
        "grid": [{"extra_args": [["--unsupported"]]}, {"max_running_requests": [8]}],
        "probe": {"prompts": 6, "max_tokens": 8, "floor_launch": False},
        "throughput": {"prompts": 8, "concurrency": 4},
    })
    report = asyncio_run(tune(job, tf))
    by = {t.index: t for t in report.trials}
    assert by[1].verdict == "unsupported", by[1].reasons
    assert by[1].launch.reason == "unsupported" and not by[1].launch.memory_bound
    assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in by[1].reasons[0]
    assert by[1].launch.stop is None or by[1].launch.stop.clean
    assert by[2].verdict == "pass" and by[2].throughput is not None and by[2].throughput.requests == 8
    assert not report.aborted and report.best is not None and report.best.index == 2
    doc = json.loads((report.out_dir / "tune.json").read_text())
    assert [t["verdict"] for t in doc["trials"]] == ["unsupported", "pass"]
