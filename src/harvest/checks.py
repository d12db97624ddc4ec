"""The typed result of a launch check (preflight): a :class:`RuleResult` per rule, in a PreflightReport.

    report = run_preflight(server, settings, probe=..., output_dir=...)   # harvest.gpu measures
    report.passed; report.failures                                        # every rule, the failed ones
    raise PreflightFailed(report.results)                                 # harvest.errors: typed too

The records sit in the base layer, below the GPU rules that fill them, so that every layer that
carries them (the error raised on a refused launch, the placements that read a far host's or a
node's report back, the commands that print them) names the same types. Nothing here measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

#: One compared number of a rule (a size, a count, a port, an address), as it goes into JSON.
Number = Union[int, float, str, None]


@dataclass(frozen=True)
class RuleResult:
    """The verdict of one rule (for one GPU when ``gpu`` is set), with the numbers it compared."""

    rule: str
    passed: bool
    detail: str
    gpu: int | None = None
    numbers: dict[str, Number] = field(default_factory=dict)
    #: True when the rule does not apply to this config (it then counts as passed).
    skipped: bool = False


@dataclass(frozen=True)
class NamedPath:
    """A path a job names that must be there where it is used (the engine's executable and model
    where the engine runs, the data where harvest reads it): the ``paths`` rule checks each."""

    #: Where the job names it: ``[server] python``, ``[server] model``, ``[data] path``.
    field: str
    path: str
    #: ``executable`` (a name without a slash is looked up on PATH), ``file``, ``file or folder``, or
    #: ``model``: a checkpoint's folder (with its ``config.json``, or ``params.json`` in Mistral's
    #: format) or a model file (GGUF).
    kind: str
    #: What to do when it is not there.
    fix: str


@dataclass(frozen=True)
class PreflightReport:
    """Every rule's result. ``attempts``/``waited_s`` say how long wait_for_preflight polled."""

    results: tuple[RuleResult, ...]
    #: Probe warnings (e.g. "v1 memory query: used includes driver-reserved memory").
    warnings: tuple[str, ...] = ()
    attempts: int = 1
    waited_s: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if not r.passed)


__all__ = ["NamedPath", "Number", "PreflightReport", "RuleResult"]
