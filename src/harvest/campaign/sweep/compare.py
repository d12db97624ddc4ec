"""Compare candidate server settings with a trusted reference on a probe set: ``harvest compare``.

    report = await compare(reference_job, [candidate_job], settings=quality_settings, out_dir=folder,
                           placement=from_config(reference_job))
    report.rows    # the noise floor row (the reference against itself), then one row per candidate

Order of work: the probe set is drawn; the reference is loaded from ``out_dir/reference.jsonl`` when
its settings hash matches, else the reference server is launched, answers greedily and scores its
own tokens, and is scored once more in the same launch (the same-launch floor). Unless
``[probe] floor_launch = false``, the reference is launched a second time and scored against the
stored reference: that is the noise floor every gate threshold is relative to. Then each candidate:
policy check (a forbidden setting is rejected and never launched) -> launch -> probe -> verified
stop. Every launch ends with its StopReport before the next one starts. A launch whose stop is
dirty is "failed", and nothing further is launched (later candidates are "not run"): memory or
processes left behind would fail or skew the next launch.

Where the servers run: each launch goes through the one-server fleets of its placement
(``placement.fleet(probe=True)``): the reference's as the command chose it, here, or with
``[host]`` on the far host (launched and stopped by the far harvest, probed from here through the
tunnel); with ``[[hosts]]`` on the first host. A candidate file that names no placement of its own
(no ``[host]``, ``[[hosts]]`` or ``[cluster]``) runs where the reference runs.

The pieces are shared with ``harvest tune``: the launches and their verdicts in
:mod:`~harvest.campaign.sweep.launch`, the probe set, reference and floor in
:mod:`~harvest.campaign.sweep.bench`, the report's common fields in :mod:`~harvest.campaign.sweep.report`.
This module never signals a process itself: launches and stops go through the placement's fleets.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harvest import safefiles
from harvest.campaign.sweep.bench import QualityBench
from harvest.campaign.sweep.launch import Launch, Launches, dirty_problems, judge
from harvest.campaign.sweep.report import SweepReport
from harvest.config import HarvestConfig, PreflightConfig, ServerConfig
from harvest.placement import Fleet, FleetFactory, OnPreflight, Placement, from_config
from harvest.quality.evaluate import GateResult, QualityReport
from harvest.quality.policy import violations
from harvest.quality.probe import ProbePrompt, select_prompts
from harvest.quality.reference import save_outputs, server_settings
from harvest.quality.settings import QualitySettings
from harvest.server import hold_index

COMPARE_SCHEMA = "harvest.compare/1"
T = TypeVar("T")


@dataclass(frozen=True)
class CompareRow:
    """One compared server: the floor (the reference against itself) or a candidate."""

    label: str
    settings: dict[str, Any]
    #: "pass", "fail", "rejected" (policy; never launched), "unsupported" (this machine cannot run
    #: the setting), "failed" (launch, probe or stop failed), or "not run" (an earlier dirty stop
    #: ended the comparison).
    verdict: str
    launch: Launch | None = None
    quality: QualityReport | None = None
    gate: GateResult | None = None
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "settings": self.settings, "verdict": self.verdict,
                "reasons": list(self.reasons), "launch": self.launch.to_dict() if self.launch else None,
                "quality": self.quality.to_dict() if self.quality else None,
                "gate": self.gate.to_dict() if self.gate else None}


@dataclass(frozen=True, kw_only=True)
class CompareReport(SweepReport):
    """A comparison: the sweep's facts and one row per compared server (the floor first)."""

    rows: tuple[CompareRow, ...]

    @property
    def passed(self) -> bool:
        """Every candidate passed (the floor row is not a candidate)."""
        return all(r.verdict == "pass" for r in self.rows if r.label != "floor")

    def to_dict(self) -> dict[str, Any]:
        return {**self.head(COMPARE_SCHEMA), "reused_reference": self.reused_reference, "passed": self.passed,
                "rows": [r.to_dict() for r in self.rows], **self.tail()}


def settings_diff(base: ServerConfig, other: ServerConfig) -> dict[str, Any]:
    """The output- or memory-relevant server fields of ``other`` that differ from ``base``."""
    a, b = server_settings(base), server_settings(other)
    return {k: v for k, v in b.items() if a.get(k) != v}


def row_from(label: str, settings: dict[str, Any], launch: Launch,
             evaluated: tuple[QualityReport, GateResult] | None) -> CompareRow:
    """A row from a launch and its evaluation (None when the launch or probe failed), judged by
    :func:`harvest.campaign.sweep.launch.judge`."""
    judged = judge(launch, evaluated)
    return CompareRow(label, settings, judged.verdict, launch, judged.quality, judged.gate, judged.reasons)


class _Comparison:
    """One ``harvest compare``: its launches in order, the rows and notes they give. Not reusable."""

    def __init__(self, reference: HarvestConfig, placement: Placement, bench: QualityBench, out_dir: Path,
                 launches: Launches):
        self.reference, self.placement, self.bench, self.out_dir = reference, placement, bench, out_dir
        self.ref_cfg = reference.require_server()
        self.launches = launches
        self.notes = launches.notes  # the placement's note first, then the comparison's
        self.rows: list[CompareRow] = []
        self.dirty = False  # a stop was not clean: nothing further is launched
        self._counter = iter(range(1000))

    async def launch(self, label: str, cfg: ServerConfig, pf: PreflightConfig, work: Callable[[Fleet], Awaitable[T]],
                     factory: FleetFactory | None = None) -> tuple[T | None, Launch]:
        """One launch in its own numbered folder; a dirty stop ends the launching."""
        folder = self.out_dir / "launches" / f"{next(self._counter):02d}-{label}"
        result, launch = await self.launches.run(label, cfg, folder, work, preflight=pf, factory=factory)
        if not launch.stopped_clean:
            self.dirty = True
            self.notes.append(f"the stop of {label} was not clean ({dirty_problems(launch)}): nothing further "
                              "was launched")
        return result, launch

    async def make_reference(self) -> None:
        """The reference's outputs (loaded when stored under the same settings, else launched)."""
        if self.bench.load():
            return
        outputs, launch = await self.launch("reference", self.ref_cfg, self.reference.preflight,
                                            self.bench.make_reference)
        self.bench.take_reference(outputs, launch.error, self.reference.source)

    async def floor(self) -> None:
        """The noise floor: a second launch of the reference when asked for, else its own launch."""
        floor_launch = None
        if self.bench.needs_floor_launch and not self.dirty:
            outputs, floor_launch = await self.launch("floor", self.ref_cfg, self.reference.preflight,
                                                      self.bench.outputs)
            failed = self.bench.take_second_launch(outputs, floor_launch.error)
            if failed is not None:
                self.notes.append(failed)
                floor_launch = None
        checked = self.bench.floor_check()
        if checked is not None:
            self.rows.append(row_from("floor", {}, floor_launch or Launch("floor", None), checked))

    async def candidate(self, label: str, cand: HarvestConfig) -> None:
        """A candidate's row: rejected by the policy, not run after a dirty stop, else launched
        where its own placement says (or, naming none, where the reference runs) and gated."""
        cfg = cand.require_server()
        diff = settings_diff(self.ref_cfg, cfg)
        broken = violations(cfg, self.bench.settings.policy)
        if broken:
            self.rows.append(CompareRow(label, diff, "rejected", reasons=tuple(broken)))
            return
        if self.dirty:
            self.rows.append(CompareRow(label, diff, "not run", reasons=("an earlier stop was not clean",)))
            return
        factory = None
        own = from_config(cand, otherwise=self.placement)
        if own is not self.placement:  # the candidate names its own: [host], [[hosts]], [cluster]
            factory = own.fleet(probe=True)
            note = own.note(True)
            if note is not None:
                self.notes.append(f"{label}: {note}")
        outputs, launch = await self.launch(label, cfg, cand.preflight, self.bench.outputs, factory)
        if outputs is not None:
            save_outputs(self.out_dir / "outputs" / f"{label}.jsonl", outputs)
        self.rows.append(row_from(label, diff, launch, self.bench.evaluate(outputs) if outputs is not None else None))

    def report(self) -> CompareReport:
        """The report, also written to ``compare.json`` in the compare folder."""
        bench = self.bench
        report = CompareReport(out_dir=self.out_dir, reference=server_settings(self.ref_cfg),
                               prompts=bench.probed, floor_source=bench.floor_source,
                               reused_reference=bench.reused, launches=tuple(self.launches.done),
                               notes=tuple(self.notes), rows=tuple(self.rows))
        with safefiles.hold(self.out_dir, create=True) as folder:
            folder.write_atomic("compare.json", json.dumps(report.to_dict(), indent=2) + "\n")
        return report


async def compare(reference: HarvestConfig, candidates: Sequence[HarvestConfig], *, settings: QualitySettings,
                  out_dir: Path, placement: Placement, force: bool = False,
                  on_preflight: OnPreflight | None = None,
                  prompts: Sequence[ProbePrompt] | None = None) -> CompareReport:
    """Compare each candidate's [server] with the reference's on the probe set (module docstring).

    ``placement``: where the reference runs, as the command chose it. ``prompts`` overrides the probe
    set (else it is drawn from the reference job's [data] and ``[probe] file``). Raises ConfigError
    when the reference cannot be produced.
    """
    out_dir = Path(out_dir)
    ref_cfg = reference.require_server()
    # Refused before any launch: a compare folder another user owns or can rename, a foreign state dir.
    safefiles.hold(out_dir, create=True).close()
    hold_index().close()
    if prompts is None:
        probe = settings.probe
        prompts = select_prompts(reference.data, n=probe.prompts, seed=probe.seed, extra=probe.file)
    run = _Comparison(reference, placement, QualityBench(out_dir, ref_cfg, settings, prompts), out_dir,
                      Launches(placement, force=force, on_preflight=on_preflight))
    await run.make_reference()
    await run.floor()
    for i, cand in enumerate(candidates):
        await run.candidate(f"candidate-{i + 1}", cand)
    return run.report()


__all__ = ["COMPARE_SCHEMA", "CompareReport", "CompareRow", "compare", "row_from", "settings_diff"]
