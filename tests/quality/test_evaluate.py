"""Quality reports and the gate: identical outputs pass at the floor, perturbed ones fail by name, a
missing capability is said, and a stored reference comes back only for the same settings."""

from __future__ import annotations

import math
import random

import pytest

from harvest.config import ServerConfig
from harvest.quality.evaluate import gate, quality_report, task_records
from harvest.quality.probe import ProbePrompt
from harvest.quality.reference import (
    ProbeOutput,
    Reference,
    ReferenceEntry,
    load_reference,
    reference_hash,
    save_reference,
)
from harvest.quality.settings import GateSettings, ProbeSettings
from harvest.quality.wire import Generation, TokenScore


def _dist(rng: random.Random, k: int = 5) -> dict[int, float]:
    weights = [rng.random() + 0.05 for _ in range(k)]
    total = sum(weights) * 1.1
    return {t: math.log(w / total) for t, w in zip(rng.sample(range(500), k), weights)}


def _scores(dists: list[dict[int, float]], tokens: list[int]) -> tuple[TokenScore, ...]:
    out = []
    for d, t in zip(dists, tokens):
        out.append(TokenScore(t, d.get(t, min(d.values()) - 1.0), d, max(d, key=d.get)))
    return tuple(out)


def make_reference(n_prompts: int = 12, length: int = 10, seed: int = 0, teacher: bool = True,
                   ids: bool = True) -> tuple[Reference, list[list[dict[int, float]]]]:
    rng = random.Random(seed)
    entries, dists = [], []
    for i in range(n_prompts):
        ds = [_dist(rng) for _ in range(length)]
        tokens = [max(d, key=d.get) for d in ds]
        gen = Generation(" ".join(map(str, tokens)), tuple(tokens) if ids else None, "length")
        scores = _scores(ds, tokens) if teacher else None
        prompt_ids = (1, 2, 3) if ids else None
        entries.append(ReferenceEntry(ProbePrompt(f"p{i}", (("user", f"prompt {i}"),)), prompt_ids,
                                      ProbeOutput(f"p{i}", gen, scores)))
        dists.append(ds)
    return Reference("h", "vllm" if teacher else "chat", 5, length, tuple(entries)), dists


def same_outputs(ref: Reference) -> list[ProbeOutput]:
    return [e.output for e in ref.entries]


def perturbed_outputs(ref: Reference, dists, noise: float, seed: int = 1) -> list[ProbeOutput]:
    rng = random.Random(seed)
    out = []
    for e, ds in zip(ref.entries, dists):
        noisy = [{t: lp + rng.gauss(0, noise) for t, lp in d.items()} for d in ds]
        tokens = [max(d, key=d.get) for d in noisy]  # the candidate's own greedy path
        scores = _scores(noisy, list(e.output.generation.token_ids))
        out.append(ProbeOutput(e.prompt.id, Generation(" ".join(map(str, tokens)), tuple(tokens), "length"),
                               scores))
    return out


def test_identical_outputs_pass_at_the_floor_and_perturbed_ones_fail_by_name():
    ref, dists = make_reference()
    floor = quality_report(ref, same_outputs(ref), resamples=200)
    metrics = floor.metrics()
    assert metrics["top1_agreement"].value == 1.0
    assert metrics["mean_kl"].value == pytest.approx(0.0, abs=1e-12)
    assert metrics["exact_match"].value == 1.0 and floor.greedy_unit == "tokens"
    assert floor.notes == ()
    result = gate(floor, floor, GateSettings())
    assert result.passed and {c.name for c in result.checks} >= {"top1_agreement", "mean_kl", "exact_match"}

    bad = quality_report(ref, perturbed_outputs(ref, dists, noise=1.0), resamples=200)
    assert bad.metrics()["mean_kl"].low > floor.metrics()["mean_kl"].high
    verdict = gate(bad, floor, GateSettings())
    assert not verdict.passed
    assert {c.name for c in verdict.failures} >= {"mean_kl", "mean_abs_delta_logprob", "top1_agreement"}

    slight = quality_report(ref, perturbed_outputs(ref, dists, noise=0.01), resamples=200)
    loose = GateSettings(top1_margin=1.0, kl_abs_min=10.0, delta_abs_min=10.0, exact_match_margin=1.0)
    assert gate(slight, floor, loose).passed
    tight = GateSettings(top1_margin=0.0, kl_factor=1.0, kl_abs_min=0.0, delta_factor=1.0, delta_abs_min=0.0,
                         exact_match_margin=0.0)
    assert not gate(slight, floor, tight).passed


def test_failed_prompts_fail_the_errors_check():
    ref, _ = make_reference(n_prompts=4)
    outputs = same_outputs(ref)
    outputs[2] = ProbeOutput(outputs[2].id, None, None, "HTTP 400: too long")
    report = quality_report(ref, outputs, resamples=50)
    assert report.prompts == 3 and report.errors == (("p2", "HTTP 400: too long"),)
    result = gate(report, None, GateSettings())
    assert [c.name for c in result.failures] == ["errors"]


def test_engine_without_prompt_logprobs_is_compared_as_text_and_says_so():
    ref, _ = make_reference(teacher=False, ids=False)
    outputs = [ProbeOutput(o.id, Generation(o.generation.text[:-1] + "#", None, "length"))
               for o in same_outputs(ref)]
    report = quality_report(ref, outputs, resamples=50,
                            engine_note="the chat protocol returns no prompt logprobs")
    assert report.teacher_forced is None and report.greedy_unit == "characters"
    assert any("no prompt logprobs" in n for n in report.notes)
    assert any("characters" in n for n in report.notes)
    assert report.metrics()["exact_match"].value == 0.0
    # every answer differs only at its last character
    lengths = [len(e.output.generation.text) for e in ref.entries]
    assert report.metrics()["mean_first_divergence"].value == pytest.approx(sum(lengths) / len(lengths) - 1)
    assert "top1_agreement" not in {c.name for c in gate(report, None, GateSettings()).checks}


def test_task_scores_are_gated_against_the_reference():
    ref, _ = make_reference(n_prompts=6)
    records = task_records(ref, None)
    assert [r["id"] for r in records] == [f"p{i}" for i in range(6)]
    assert records[0]["messages"] == [{"role": "user", "content": "prompt 0"}] and records[0]["output"]
    worse = quality_report(ref, same_outputs(ref), resamples=50, task=([1.0] * 6, [0.5] * 6))
    assert worse.task is not None and worse.task.candidate.value == 0.5
    result = gate(worse, None, GateSettings(task_margin=0.1))
    assert [c.name for c in result.failures] == ["task_score"]
    assert gate(quality_report(ref, same_outputs(ref), resamples=50, task=([1.0] * 6, [0.95] * 6)), None,
                GateSettings(task_margin=0.1)).passed


def test_reference_round_trip_and_hash(tmp_path):
    ref, _ = make_reference(n_prompts=3)
    path = save_reference(tmp_path / "reference.jsonl", ref)
    back = load_reference(path, "h")
    assert back is not None
    assert back.entries == ref.entries and back.top_k == 5 and back.teacher_forcing
    assert load_reference(path, "other") is None
    assert load_reference(tmp_path / "missing.jsonl") is None

    base = ServerConfig(engine="vllm", model="m", port=8000)
    prompts = [e.prompt for e in ref.entries]
    probe = ProbeSettings()
    h = reference_hash(base, probe, prompts, "vllm")
    assert h == reference_hash(base.model_copy(update={"port": 9000}), probe, prompts, "vllm")  # neutral
    assert h != reference_hash(base.model_copy(update={"kv_cache_dtype": "fp8"}), probe, prompts, "vllm")
    assert h != reference_hash(base, probe.model_copy(update={"max_tokens": 7}), prompts, "vllm")
    assert h != reference_hash(base, probe, prompts[:2], "vllm")
