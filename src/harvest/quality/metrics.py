"""Quality metrics of a candidate server against a reference, with bootstrap confidence intervals.

Pure functions over records; no I/O. Two families:

- teacher-forced: the reference's own greedy tokens scored under the candidate (prompt logprobs).
  Per position: does the candidate's top-1 equal the reference token, |delta logprob| of that token,
  and KL(reference || candidate) approximated from the two top-k lists.
- free-running greedy: the candidate's own greedy tokens against the reference's: exact match and
  the first position where they diverge.

Every aggregate is reported with a percentile bootstrap interval that resamples *prompts* (positions
of one prompt are not independent), with a fixed seed so reruns agree.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

#: A unit of the bootstrap (a prompt's measurements).
U = TypeVar("U")
from dataclasses import dataclass

#: log-probability given to a token absent from a top-k list, relative to the list's smallest entry.
MISSING_LOGPROB_MARGIN = math.log(2.0)


@dataclass(frozen=True)
class PositionScores:
    """One reference token scored under the candidate."""

    ref_token: int
    ref_logprob: float
    cand_logprob: float
    #: Candidate's most likely token at this position.
    cand_top1: int
    #: Top-k of each side: token id -> logprob.
    ref_top: dict[int, float]
    cand_top: dict[int, float]


@dataclass(frozen=True)
class Estimate:
    """A metric with its bootstrap interval."""

    value: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]"


def approx_kl(ref_top: dict[int, float], cand_top: dict[int, float]) -> float:
    """KL(ref || cand) over the reference's top-k, a lower-bound-style approximation.

    Tokens the candidate's top-k lacks get a logprob just below the candidate's smallest listed one.
    The reference mass outside its top-k is compared as one lumped "rest" bucket.
    """
    if not ref_top:
        return 0.0
    floor = (min(cand_top.values()) - MISSING_LOGPROB_MARGIN) if cand_top else -30.0
    kl = 0.0
    ref_mass = cand_mass = 0.0
    for tok, lp in ref_top.items():
        p = math.exp(lp)
        lq = cand_top.get(tok, floor)
        kl += p * (lp - lq)
        ref_mass += p
        cand_mass += math.exp(lq)
    rest_p, rest_q = max(1.0 - ref_mass, 0.0), max(1.0 - cand_mass, 1e-12)
    if rest_p > 1e-12:
        kl += rest_p * (math.log(rest_p) - math.log(rest_q))
    return max(kl, 0.0)


@dataclass(frozen=True)
class PromptTeacherForced:
    """Per-prompt aggregates of teacher-forced scores (the unit the bootstrap resamples)."""

    positions: int
    top1_agree: int
    abs_delta_sum: float
    abs_deltas: tuple[float, ...]
    kl_sum: float


def summarize_prompt(scores: Sequence[PositionScores]) -> PromptTeacherForced:
    deltas = tuple(abs(s.cand_logprob - s.ref_logprob) for s in scores)
    return PromptTeacherForced(
        positions=len(scores),
        top1_agree=sum(1 for s in scores if s.cand_top1 == s.ref_token),
        abs_delta_sum=sum(deltas),
        abs_deltas=deltas,
        kl_sum=sum(approx_kl(s.ref_top, s.cand_top) for s in scores),
    )


def first_divergence(ref: Sequence[int], cand: Sequence[int]) -> int | None:
    """Index of the first differing token, None when identical."""
    for i, (a, b) in enumerate(zip(ref, cand)):
        if a != b:
            return i
    return None if len(ref) == len(cand) else min(len(ref), len(cand))


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return sorted_values[int(k)]
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def bootstrap(units: Sequence[U], stat: Callable[[Sequence[U]], float], *, resamples: int = 1000,
              seed: int = 0, confidence: float = 0.95) -> Estimate:
    """Percentile bootstrap of ``stat`` over ``units`` (prompts), deterministic for a seed."""
    value = stat(units) if units else math.nan
    if len(units) < 2:
        return Estimate(value, value, value, len(units))
    rng = random.Random(seed)
    n = len(units)
    samples = sorted(stat([units[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    alpha = (1.0 - confidence) / 2
    return Estimate(value, _percentile(samples, alpha), _percentile(samples, 1 - alpha), n)


def _ratio(num: Callable[[U], float], den: Callable[[U], float]) -> Callable[[Sequence[U]], float]:
    def stat(units: Sequence[U]) -> float:
        d = sum(den(u) for u in units)
        return sum(num(u) for u in units) / d if d else math.nan

    return stat


def _p99(units: Sequence[object]) -> float:
    values = sorted(d for u in units for d in u.abs_deltas)  # type: ignore[attr-defined]
    return _percentile(values, 0.99)


@dataclass(frozen=True)
class TeacherForcedReport:
    top1_agreement: Estimate
    mean_abs_delta_logprob: Estimate
    p99_abs_delta_logprob: Estimate
    mean_kl: Estimate
    positions: int


def teacher_forced_report(prompts: Sequence[PromptTeacherForced], *, seed: int = 0,
                          resamples: int = 1000) -> TeacherForcedReport:
    pos = lambda u: u.positions  # noqa: E731
    return TeacherForcedReport(
        top1_agreement=bootstrap(prompts, _ratio(lambda u: u.top1_agree, pos), seed=seed, resamples=resamples),
        mean_abs_delta_logprob=bootstrap(prompts, _ratio(lambda u: u.abs_delta_sum, pos), seed=seed,
                                         resamples=resamples),
        p99_abs_delta_logprob=bootstrap(prompts, _p99, seed=seed, resamples=resamples),
        mean_kl=bootstrap(prompts, _ratio(lambda u: u.kl_sum, pos), seed=seed, resamples=resamples),
        positions=sum(p.positions for p in prompts),
    )


@dataclass(frozen=True)
class GreedyReport:
    exact_match: Estimate
    #: Mean index of the first differing token; identical outputs count as their full length.
    mean_first_divergence: Estimate


def greedy_report(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, seed: int = 0,
                  resamples: int = 1000) -> GreedyReport:
    units = [(first_divergence(r, c), len(r)) for r, c in pairs]
    exact = lambda us: sum(1 for d, _ in us if d is None) / len(us)  # noqa: E731
    div = lambda us: sum((n if d is None else d) for d, n in us) / len(us)  # noqa: E731
    return GreedyReport(bootstrap(units, exact, seed=seed, resamples=resamples),
                        bootstrap(units, div, seed=seed, resamples=resamples))


__all__ = [
    "Estimate",
    "GreedyReport",
    "PositionScores",
    "PromptTeacherForced",
    "TeacherForcedReport",
    "approx_kl",
    "bootstrap",
    "first_divergence",
    "greedy_report",
    "summarize_prompt",
    "teacher_forced_report",
]
