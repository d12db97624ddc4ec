"""The user's settings of a quality comparison: the probe set, the gate, the task check, the policy.

These are the ``[probe]``, ``[gate]``, ``[task]`` and ``[policy]`` tables of a tune file (see
:mod:`harvest.campaign.sweep.tune_file`), also read by ``harvest compare --settings``. Pydantic models, frozen,
unknown fields refused; this module only describes settings and never touches the machine.

Gate rules, all relative to the noise floor (the reference against a second launch of itself, or
within its own launch when no second launch is made):

    top-1 agreement          candidate >= floor.low  - top1_margin
    mean KL (approximate)    candidate <= max(floor.high * kl_factor, kl_abs_min)
    mean |delta logprob|     candidate <= max(floor.high * delta_factor, delta_abs_min)
    greedy exact match       candidate >= floor.low  - exact_match_margin
    task score               candidate >= reference  - task_margin        (when a task check is set)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Largest top-k the engines return per position (vLLM refuses more than 20 prompt logprobs).
MAX_TOP_K = 20


class ProbeSettings(_Model):
    """The probe set and how it is generated and scored."""

    #: Prompts drawn from the job's dataset (deterministically, by a seeded hash of their ids).
    prompts: int = Field(32, ge=0)
    seed: int = 0
    #: Extra prompts (any dataset shape harvest reads) added to the drawn ones.
    file: str | None = None
    #: Tokens the reference generates greedily per prompt (the scored continuation).
    max_tokens: int = Field(64, ge=1)
    #: Top-k logprobs kept per position on both sides (KL is approximated over them).
    top_k: int = Field(MAX_TOP_K, ge=1, le=MAX_TOP_K)
    #: Probe requests in flight at once.
    concurrency: int = Field(8, ge=1)
    #: Wire protocol of the probe: ``auto`` picks by engine (vllm, sglang; anything else: chat).
    protocol: Literal["auto", "vllm", "sglang", "chat"] = "auto"
    request_timeout: float = Field(300.0, gt=0)
    #: Bootstrap resamples of every interval (prompts are resampled).
    resamples: int = Field(1000, ge=10)
    #: Launch the reference a second time to measure the noise floor (else: within its own launch).
    floor_launch: bool = True


class GateSettings(_Model):
    """Thresholds a candidate must meet, relative to the noise floor (see the module docstring)."""

    top1_margin: float = Field(0.02, ge=0)
    kl_factor: float = Field(2.0, ge=0)
    kl_abs_min: float = Field(0.002, ge=0)
    delta_factor: float = Field(2.0, ge=0)
    delta_abs_min: float = Field(0.02, ge=0)
    exact_match_margin: float = Field(0.25, ge=0)
    task_margin: float = Field(0.02, ge=0)


class TaskSettings(_Model):
    """An optional task check that scores outputs (higher is better).

    ``command``: an argv that reads JSON Lines on stdin, one ``{"id", "messages", "output"}`` per
    prompt, and writes one score per prompt on stdout (a number per line, or ``{"id", "score"}``
    objects). ``function``: ``"module:function"`` called with the same list of dicts, returning a
    list of numbers in the same order.
    """

    command: list[str] = Field(default_factory=list)
    function: str | None = None
    timeout: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> TaskSettings:
        if self.command and self.function:
            raise ValueError("set either `command` or `function`, not both")
        if self.function is not None and ":" not in self.function:
            raise ValueError("`function` must read 'module:function'")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.command) or self.function is not None


class PolicySettings(_Model):
    """Hard rules that reject a setting before it is ever launched.

    Each ``forbid`` pattern is matched (fnmatch, case-sensitive) against ``key=value`` for every
    server field, e.g. ``kv_cache_dtype=fp8*`` or ``extra_args=*--enforce-eager*``.
    """

    forbid: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _patterns(self) -> PolicySettings:
        for pattern in self.forbid:
            if "=" not in pattern:
                raise ValueError(f"forbid pattern {pattern!r} must read 'key=value-pattern'")
        return self


class QualitySettings(_Model):
    """The quality tables of a tune (or compare settings) file."""

    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    task: TaskSettings = Field(default_factory=TaskSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)


__all__ = [
    "MAX_TOP_K",
    "GateSettings",
    "PolicySettings",
    "ProbeSettings",
    "QualitySettings",
    "TaskSettings",
]
