"""A candidate's quality report against the reference, and the gate that turns it into a verdict.

    report = quality_report(reference, outputs, resamples=1000, task=(ref_scores, cand_scores))
    result = gate(report, floor_report, settings.gate)      # result.passed, result.checks

The report holds (a) teacher-forced metrics (top-1 agreement, mean and p99 |delta logprob|,
approximate KL) when both sides have prompt logprobs, (b) free-running greedy exact match and mean
first divergence (over token ids, or characters where the engine reports no ids), and (c) the task
score when a task check is configured, each with a prompt-level bootstrap interval
(:mod:`harvest.quality.metrics`). ``notes`` says what could not be measured and why.

The gate compares a candidate with the noise floor (the reference against itself); thresholds are
described in :mod:`harvest.quality.settings`. Pure functions over records: no I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harvest.quality.metrics import (
    Estimate,
    GreedyReport,
    PositionScores,
    TeacherForcedReport,
    bootstrap,
    greedy_report,
    summarize_prompt,
    teacher_forced_report,
)
from harvest.quality.reference import ProbeOutput, Reference
from harvest.quality.settings import GateSettings


@dataclass(frozen=True)
class TaskReport:
    """Mean task score of the candidate's answers and of the reference's, on the same prompts."""

    candidate: Estimate
    reference: Estimate


@dataclass(frozen=True)
class QualityReport:
    """A candidate against the reference on the probe set."""

    #: Prompts compared (those the candidate answered).
    prompts: int
    #: Prompts the candidate failed: (id, error).
    errors: tuple[tuple[str, str], ...]
    teacher_forced: TeacherForcedReport | None
    greedy: GreedyReport | None
    #: Unit of greedy positions: "tokens" (ids compared) or "characters" (text compared).
    greedy_unit: Literal["tokens", "characters"]
    task: TaskReport | None = None
    #: What could not be measured and why.
    notes: tuple[str, ...] = ()

    def metrics(self) -> dict[str, Estimate]:
        """Every measured metric by name (``top1_agreement``, ``mean_kl``, ``exact_match``, ...)."""
        out: dict[str, Estimate] = {}
        tf = self.teacher_forced
        if tf is not None:
            out.update(top1_agreement=tf.top1_agreement, mean_abs_delta_logprob=tf.mean_abs_delta_logprob,
                       p99_abs_delta_logprob=tf.p99_abs_delta_logprob, mean_kl=tf.mean_kl)
        if self.greedy is not None:
            out.update(exact_match=self.greedy.exact_match,
                       mean_first_divergence=self.greedy.mean_first_divergence)
        if self.task is not None:
            out.update(task_score=self.task.candidate, reference_task_score=self.task.reference)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "errors": [{"id": i, "error": e} for i, e in self.errors],
            "teacher_forced_positions": self.teacher_forced.positions if self.teacher_forced else None,
            "greedy_unit": self.greedy_unit,
            "metrics": {name: estimate_dict(e) for name, e in self.metrics().items()},
            "notes": list(self.notes),
        }


def estimate_dict(e: Estimate) -> dict[str, Any]:
    def num(x: float) -> float | None:
        return None if x is None or math.isnan(x) else round(x, 6)

    return {"value": num(e.value), "low": num(e.low), "high": num(e.high), "n": e.n}


def _codepoints(text: str) -> list[int]:
    return [ord(c) for c in text]


def quality_report(reference: Reference, outputs: Sequence[ProbeOutput], *, resamples: int = 1000,
                   seed: int = 0,
                   task: tuple[Sequence[float], Sequence[float]] | None = None,
                   engine_note: str | None = None) -> QualityReport:
    """Compare ``outputs`` (one per reference prompt, matched by id) with the reference.

    ``task``: (reference scores, candidate scores) over the prompts the candidate answered, in
    reference order. ``engine_note``: why teacher forcing is unavailable, when it is.
    """
    by_id = {o.id: o for o in outputs}
    errors: list[tuple[str, str]] = []
    answered: list[tuple[Any, ProbeOutput]] = []
    for entry in reference.entries:
        out = by_id.get(entry.prompt.id)
        if out is None or out.error is not None or out.generation is None:
            errors.append((entry.prompt.id, out.error if out is not None and out.error else "no answer"))
        else:
            answered.append((entry, out))
    by_tokens = all(e.output.generation is not None and e.output.generation.token_ids is not None
                    and o.generation is not None and o.generation.token_ids is not None for e, o in answered)
    tf_units = []
    pairs: list[tuple[Sequence[int], Sequence[int]]] = []
    for entry, out in answered:
        ref_gen, cand_gen = entry.output.generation, out.generation
        # answered: the candidate's generation is there (checked above), and a reference entry
        # holds the generation it was made from (quality/reference.py: generate_reference)
        assert ref_gen is not None and cand_gen is not None
        if by_tokens:
            assert ref_gen.token_ids is not None and cand_gen.token_ids is not None
            pairs.append((list(ref_gen.token_ids), list(cand_gen.token_ids)))
        else:
            pairs.append((_codepoints(ref_gen.text), _codepoints(cand_gen.text)))
        ref_scores, cand_scores = entry.output.scores, out.scores
        if ref_scores is not None and cand_scores is not None and len(ref_scores) == len(cand_scores):
            tf_units.append(summarize_prompt([
                PositionScores(r.token, r.logprob, c.logprob, c.top1, r.top, c.top)
                for r, c in zip(ref_scores, cand_scores)]))
    notes = []
    teacher = None
    if tf_units:
        teacher = teacher_forced_report(tf_units, seed=seed, resamples=resamples)
    else:
        notes.append("teacher-forced metrics not measured: "
                     + (engine_note or "no prompt logprobs on one side (engine without prompt logprobs)"))
    greedy = greedy_report(pairs, seed=seed, resamples=resamples) if pairs else None
    unit: Literal["tokens", "characters"] = "tokens" if by_tokens else "characters"
    if not by_tokens:
        notes.append("greedy outputs compared as text (characters): the engine reports no token ids")
    task_report = None
    if task is not None:
        ref_scores_, cand_scores_ = list(task[0]), list(task[1])
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        task_report = TaskReport(bootstrap(cand_scores_, mean, seed=seed, resamples=resamples),
                                 bootstrap(ref_scores_, mean, seed=seed, resamples=resamples))
    return QualityReport(len(pairs), tuple(errors), teacher, greedy, unit, task_report, tuple(notes))


def task_records(reference: Reference, outputs: Sequence[ProbeOutput] | None) -> list[dict[str, Any]]:
    """Records for the task check: the reference's answers (``outputs`` None) or a candidate's."""
    by_id = {o.id: o for o in outputs} if outputs is not None else None
    records = []
    for entry in reference.entries:
        out = entry.output if by_id is None else by_id.get(entry.prompt.id)
        if out is None or out.generation is None:
            continue
        records.append({"id": entry.prompt.id, "messages": entry.prompt.as_messages(),
                        "output": out.generation.text})
    return records


# --- the gate ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One gate rule applied: ``value op limit``."""

    name: str
    value: float
    op: Literal[">=", "<="]
    limit: float
    passed: bool

    def __str__(self) -> str:
        return f"{self.name} {self.value:.4g} {self.op} {self.limit:.4g}: {'ok' if self.passed else 'FAIL'}"


@dataclass(frozen=True)
class GateResult:
    passed: bool
    checks: tuple[Check, ...]

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [
            {"name": c.name, "value": round(c.value, 6), "op": c.op, "limit": round(c.limit, 6),
             "passed": c.passed}
            for c in self.checks]}


def _at_least(name: str, value: float, limit: float) -> Check:
    return Check(name, value, ">=", limit, value >= limit - 1e-12)


def _at_most(name: str, value: float, limit: float) -> Check:
    return Check(name, value, "<=", limit, value <= limit + 1e-12)


def _ok(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def gate(candidate: QualityReport, floor: QualityReport | None, settings: GateSettings) -> GateResult:
    """Apply the thresholds of ``settings`` to ``candidate``, relative to the noise ``floor``.

    Without a floor the ideal one is used (agreement 1, divergence 0). A metric that one side
    lacks is not checked; a candidate that failed any probe prompt fails the ``errors`` check.
    """
    checks = [_at_most("errors", float(len(candidate.errors)), 0.0)]
    c, f = candidate.metrics(), floor.metrics() if floor is not None else {}

    def low(name: str, ideal: float) -> float:
        e = f.get(name)
        return e.low if e is not None and _ok(e.low) else ideal

    def high(name: str, ideal: float) -> float:
        e = f.get(name)
        return e.high if e is not None and _ok(e.high) else ideal

    if "top1_agreement" in c and _ok(c["top1_agreement"].value):
        checks.append(_at_least("top1_agreement", c["top1_agreement"].value,
                                low("top1_agreement", 1.0) - settings.top1_margin))
    if "mean_kl" in c and _ok(c["mean_kl"].value):
        checks.append(_at_most("mean_kl", c["mean_kl"].value,
                               max(high("mean_kl", 0.0) * settings.kl_factor, settings.kl_abs_min)))
    if "mean_abs_delta_logprob" in c and _ok(c["mean_abs_delta_logprob"].value):
        checks.append(_at_most("mean_abs_delta_logprob", c["mean_abs_delta_logprob"].value,
                               max(high("mean_abs_delta_logprob", 0.0) * settings.delta_factor,
                                   settings.delta_abs_min)))
    if "exact_match" in c and _ok(c["exact_match"].value):
        checks.append(_at_least("exact_match", c["exact_match"].value,
                                low("exact_match", 1.0) - settings.exact_match_margin))
    if candidate.task is not None and _ok(candidate.task.candidate.value):
        checks.append(_at_least("task_score", candidate.task.candidate.value,
                                candidate.task.reference.value - settings.task_margin))
    return GateResult(all(ch.passed for ch in checks), tuple(checks))


__all__ = [
    "Check",
    "GateResult",
    "QualityReport",
    "TaskReport",
    "estimate_dict",
    "gate",
    "quality_report",
    "task_records",
]
