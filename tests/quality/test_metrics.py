"""Quality metrics: identical distributions score perfect, perturbed ones measurably worse."""

from __future__ import annotations

import math
import random

import pytest

from harvest.quality.metrics import (
    PositionScores,
    approx_kl,
    bootstrap,
    first_divergence,
    greedy_report,
    summarize_prompt,
    teacher_forced_report,
)


def _dist(rng: random.Random, k: int = 5) -> dict[int, float]:
    weights = [rng.random() + 0.01 for _ in range(k)]
    total = sum(weights) * 1.05  # leave 5% of the mass outside the top-k
    return {tok: math.log(w / total) for tok, w in zip(rng.sample(range(1000), k), weights)}


def _position(ref: dict[int, float], cand: dict[int, float]) -> PositionScores:
    ref_tok = max(ref, key=ref.get)
    cand_top1 = max(cand, key=cand.get)
    return PositionScores(ref_tok, ref[ref_tok], cand.get(ref_tok, min(cand.values()) - 1), cand_top1, ref, cand)


def test_kl_is_zero_for_identical_lists_and_grows_with_perturbation():
    rng = random.Random(1)
    d = _dist(rng)
    assert approx_kl(d, d) == pytest.approx(0.0, abs=1e-12)
    shifted = {t: lp + (0.5 if i == 0 else -0.2) for i, (t, lp) in enumerate(d.items())}
    assert approx_kl(d, shifted) > 0.01
    missing = dict(list(d.items())[1:])
    assert approx_kl(d, missing) > 0.0


def test_teacher_forced_identical_vs_perturbed():
    rng = random.Random(2)
    prompts_same, prompts_noisy = [], []
    for _ in range(30):
        ref = [_dist(rng) for _ in range(20)]
        prompts_same.append(summarize_prompt([_position(d, d) for d in ref]))
        noisy = []
        for d in ref:
            cand = {t: lp + rng.gauss(0, 1.0) for t, lp in d.items()}
            noisy.append(_position(d, cand))
        prompts_noisy.append(summarize_prompt(noisy))
    same = teacher_forced_report(prompts_same, resamples=200)
    noisy = teacher_forced_report(prompts_noisy, resamples=200)
    assert same.top1_agreement.value == 1.0
    assert same.mean_abs_delta_logprob.value == 0.0
    assert noisy.top1_agreement.value < 0.9
    assert noisy.mean_abs_delta_logprob.low > 0.1
    assert noisy.mean_kl.value > same.mean_kl.value
    assert noisy.top1_agreement.low <= noisy.top1_agreement.value <= noisy.top1_agreement.high
    assert same.positions == 600


def test_first_divergence_and_greedy_report():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    rep = greedy_report([([1, 2, 3], [1, 2, 3]), ([1, 2, 3, 4], [1, 5, 3, 4])], resamples=100)
    assert rep.exact_match.value == 0.5
    assert rep.mean_first_divergence.value == pytest.approx((3 + 1) / 2)


def test_bootstrap_is_deterministic_and_brackets_the_value():
    units = list(range(50))
    mean = lambda us: sum(us) / len(us)  # noqa: E731
    a = bootstrap(units, mean, seed=7, resamples=300)
    b = bootstrap(units, mean, seed=7, resamples=300)
    assert a == b
    assert a.low < a.value < a.high
    assert a.value == pytest.approx(24.5)
