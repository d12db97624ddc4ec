"""What a sweep reports, whichever job ran it: :class:`SweepReport`.

``harvest compare``'s :class:`~harvest.campaign.sweep.compare.CompareReport` (rows: the floor and
each candidate) and ``harvest tune``'s :class:`~harvest.campaign.sweep.tune.TuneReport` (trials, the
best) extend it with their own results. Their JSON documents (``harvest.compare/1`` in
``compare.json``, ``harvest.tune/1`` in ``tune.json``, read by :mod:`harvest.report.compare` and
:mod:`harvest.report.tune`) begin with :meth:`SweepReport.head` and end with
:meth:`SweepReport.tail`, in the order those readers and earlier folders know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.campaign.sweep.launch import Launch

#: Every verdict a tune trial can get (``harvest.campaign.sweep.tune``'s docstring), in the order its
#: report counts them.
TRIAL_VERDICTS = ("pass", "fail", "rejected", "skipped", "unsupported", "failed", "not run")


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """The facts every sweep has: its folder, the reference, the probe set, the floor, the launches."""

    out_dir: Path
    #: The reference's output- and memory-relevant server settings.
    reference: dict[str, Any]
    #: Probe prompts the reference answered.
    prompts: int
    #: Which floor the gate used (``second launch`` or ``same launch``; None when none was measured).
    floor_source: str | None
    #: The reference (and its floors) came from the folder, made earlier with the same settings.
    reused_reference: bool
    #: Every launch of the sweep in order (reference and floor included), with its stop.
    launches: tuple[Launch, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def all_stops_clean(self) -> bool:
        return all(launch.stopped_clean for launch in self.launches)

    def head(self, schema: str) -> dict[str, Any]:
        """The document's first fields: its schema, the folder, the reference, the probe set, the floor."""
        return {"schema": schema, "out_dir": str(self.out_dir), "reference": self.reference,
                "prompts": self.prompts, "floor_source": self.floor_source}

    def tail(self) -> dict[str, Any]:
        """The document's last fields: the launches and the notes."""
        return {"launches": [x.to_dict() for x in self.launches], "notes": list(self.notes)}


__all__ = ["SweepReport", "TRIAL_VERDICTS"]
