"""What ``gpus`` and ``preflight`` answer, one type for every placement (this machine, SSH hosts, Ray nodes).

Each place answers with one measurement (``harvest.gpus/1``) or one check (``harvest.preflight/1``),
or says why it gave none. ``to_json()`` is the ``--json`` document, ``harvest.gpus/2`` /
``harvest.preflight/2``, the same whatever the placement (docs/json-schema.md), with one entry per
place in ``places``. The CLI shows the places as one table with a first column naming each; a
result of this machine also holds its own measurement (``here``), which the CLI shows in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harvest import schemas
from harvest.errors import RemoteError
from harvest.gpu.preflight import PreflightReport
from harvest.gpu.records import GpuSnapshot, HostState


@dataclass(frozen=True)
class Answer:
    """One place's answer to a probe (``gpus``, ``preflight``): its JSON document, or why there is none."""

    label: str
    doc: dict[str, Any] | None
    error: str | None = None
    extra: dict[str, Any] | None = None


def place_json(answer: Answer) -> dict[str, Any]:
    """One entry of ``places``: where, its answer (or null and why), and a Ray node's own facts
    (``node_id``, ``resources``, ``waited_s``; null elsewhere)."""
    extra = answer.extra or {}
    return {"where": answer.label, "answer": answer.doc, "error": answer.error,
            "node_id": extra.get("node_id"), "resources": extra.get("resources"), "waited_s": extra.get("waited_s")}


def one_answer(doc: dict[str, Any], *, where: str, step: str) -> dict[str, Any]:
    """The one place's answer of a far ``harvest gpus|preflight --json`` (a far harvest is local there)."""
    try:
        (place,) = doc["places"]
        answer = place["answer"]
    except (KeyError, TypeError, ValueError):
        raise RemoteError(where, step, 0.0, "the far answer does not hold exactly one place", exit_code=2) from None
    if not isinstance(answer, dict):
        raise RemoteError(where, step, 0.0, f"the far harvest measured nothing: {place.get('error')}")
    return answer


@dataclass(frozen=True)
class GpusByPlace:
    """Every place's ``harvest.gpus/1`` measurement (or why there is none)."""

    placement: str  # the placement's kind: local, ssh or ray
    where: str
    column: str  # "host" or "node": what a place is called
    title: str
    answers: tuple[Answer, ...]
    #: This machine's own snapshot and host state, when the one place is this machine.
    here: tuple[GpuSnapshot, HostState] | None = None

    @property
    def ok(self) -> bool:
        return all(a.doc is not None for a in self.answers)

    def to_json(self) -> dict[str, Any]:
        return {"schema": schemas.GPUS_PLACES, "placement": self.placement, "where": self.where,
                "places": [place_json(a) for a in self.answers]}


@dataclass(frozen=True)
class PreflightByPlace:
    """Every place's ``harvest.preflight/1`` check of one [server] (or why there is none)."""

    placement: str
    where: str
    column: str
    header: str
    config: str
    engine: str
    answers: tuple[Answer, ...]
    #: This machine's own report (every rule, the waiting), when the one place is this machine.
    here: PreflightReport | None = None

    @property
    def passed(self) -> bool:
        return all(a.doc is not None and bool(a.doc.get("passed")) for a in self.answers)

    def to_json(self) -> dict[str, Any]:
        return {"schema": schemas.PREFLIGHT_PLACES, "placement": self.placement, "where": self.where,
                "config": self.config, "engine": self.engine, "passed": self.passed,
                "places": [place_json(a) for a in self.answers]}


__all__ = ["Answer", "GpusByPlace", "PreflightByPlace", "one_answer", "place_json"]
