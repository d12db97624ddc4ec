"""The records of a verified stop, shared by the layer that stops a server and the layers that report it.

    StopReport(run_dir, verdict, steps=(StopStep(...), ...), escalated, holders=(Holder(...), ...), ...)

:mod:`harvest.server.stop` measures and fills them where the server ran; a far harvest's or a Ray
actor's stop comes back as the same :class:`StopReport`, parsed from its JSON
(:mod:`harvest.placement.far_records`), never as a new shape. :class:`ProcessRef` is here because a
report names processes by it (survivors, port holders); the launch record
(:mod:`harvest.server.state`) uses the same type.

Records only: this module measures nothing, signals nothing and imports no other harvest module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: A GPU is "back" when its used MiB is at most baseline + this margin.
DEFAULT_MARGIN_MIB = 256

Verdict = Literal["clean", "dirty"]


@dataclass(frozen=True)
class ProcessRef:
    """One process harvest started or saw descending from it; (pid, create_time) identify it."""

    pid: int
    create_time: float
    name: str | None = None


@dataclass(frozen=True)
class StopStep:
    """One step of a stop: what it did and how long it took."""

    name: str
    duration_s: float
    outcome: str
    #: False when the step left something undone (time ran out, a measurement failed).
    ok: bool = True


@dataclass(frozen=True)
class Holder:
    """A process holding memory on a GPU the server used, seen at the end of the stop."""

    gpu: int
    pid: int
    name: str | None
    used_mib: int | None
    #: True when it is one of the recorded processes of this server.
    ours: bool


@dataclass(frozen=True)
class StopReport:
    """What a stop did and what it measured afterwards."""

    run_dir: str
    verdict: Verdict
    steps: tuple[StopStep, ...]
    #: SIGKILL had to be sent (something outlived SIGTERM and the grace period).
    escalated: bool
    baseline_mib: dict[int, int] = field(default_factory=dict)
    final_mib: dict[int, int] = field(default_factory=dict)
    holders: tuple[Holder, ...] = ()
    #: Recorded processes still alive at the end.
    survivors: tuple[ProcessRef, ...] = ()
    #: The port could not be bound again at the end (something still holds it).
    port_open: bool = False
    #: The processes listening on the port at the end, when it is still in use (as far as visible).
    port_holders: tuple[ProcessRef, ...] = ()
    total_s: float = 0.0
    deadline_s: float = 0.0
    #: Why the verdict is dirty (empty when clean).
    problems: tuple[str, ...] = ()
    #: The server stopped, as its launch record names it (None in reports written before these).
    engine: str | None = None
    pid: int | None = None

    @property
    def clean(self) -> bool:
        return self.verdict == "clean"

    def step(self, name: str) -> StopStep | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["baseline_mib"] = {str(k): v for k, v in self.baseline_mib.items()}
        d["final_mib"] = {str(k): v for k, v in self.final_mib.items()}
        return d


__all__ = ["DEFAULT_MARGIN_MIB", "Holder", "ProcessRef", "StopReport", "StopStep", "Verdict"]
