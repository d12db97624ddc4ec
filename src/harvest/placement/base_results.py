"""The answers of far places (SSH hosts, Ray nodes) to ``gpus`` and ``preflight``, one shape for both.

Each place answers with the document a local ``harvest gpus|preflight --json`` prints (or says why
it gave none); the CLI renders them as one table with a first column naming the place, and prints
``to_json()`` for ``--json`` (the documented ``harvest.*-hosts/1`` / ``harvest.*-cluster/1`` shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harvest.placement.base import Answer


@dataclass(frozen=True)
class FarGpus:
    """Every place's ``harvest.gpus/1`` document (or why there is none)."""

    column: str  # "host" or "node": what a place is called
    title: str
    answers: tuple[Answer, ...]
    doc: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(a.doc is not None for a in self.answers)

    def to_json(self) -> dict[str, Any]:
        return self.doc


@dataclass(frozen=True)
class FarPreflight:
    """Every place's ``harvest.preflight/1`` document for one [server] (or why there is none)."""

    column: str
    header: str
    answers: tuple[Answer, ...]
    doc: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(a.doc is not None and bool(a.doc.get("passed")) for a in self.answers)

    def to_json(self) -> dict[str, Any]:
        return self.doc


__all__ = ["FarGpus", "FarPreflight"]
