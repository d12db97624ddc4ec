"""The probe set, the reference and the noise floor of one sweep folder: :class:`QualityBench`.

    bench = QualityBench(folder, reference_config, settings, prompts)
    if not bench.load():                       # a stored reference made with the same settings
        outputs, launch = await launches.run("reference", reference_config, folder / "reference",
                                             bench.make_reference, preflight=job.preflight)
        bench.take_reference(outputs, launch.error, job.source)
    report, gate = bench.evaluate(await bench.outputs(server))

The reference answers greedily and is scored once more in its own launch (the same-launch floor);
a second launch of the reference scored against it is the second-launch floor, the one the gate
uses when there is one. Both are stored next to ``reference.jsonl`` with the settings hash, so a
later sweep with the same reference settings reuses them. Launching and stopping are the caller's
(:mod:`harvest.campaign.sweep.launch`); this module only probes servers it is given and scores.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.config import ServerConfig
from harvest.errors import ConfigError
from harvest.placement import Fleet
from harvest.quality.evaluate import GateResult, QualityReport, gate, quality_report, task_records
from harvest.quality.probe import ProbePrompt
from harvest.quality.reference import (
    REFERENCE_FILE,
    ProbeOutput,
    Reference,
    generate_reference,
    load_reference,
    output_from,
    output_json,
    reference_hash,
    run_candidate,
    save_reference,
    server_settings,
)
from harvest.quality.settings import QualitySettings
from harvest.quality.task import run_task
from harvest.quality.wire import Wire, open_wire, protocol_for

#: Sources of a noise floor: a second launch of the reference, or a rescoring in its own launch.
SECOND_LAUNCH = "second launch"
SAME_LAUNCH = "same launch"
FLOOR_SOURCES = (SAME_LAUNCH, SECOND_LAUNCH)
FLOOR_FILES = {SAME_LAUNCH: "floor-same-launch.jsonl", SECOND_LAUNCH: "floor-second-launch.jsonl"}


def _floor_header(settings_hash: str, source: str) -> dict[str, Any]:
    return {"schema": "harvest.floor/1", "settings_hash": settings_hash, "source": source}


class QualityBench:
    """The probe set, the reference and the noise floor of one sweep folder (compare or tune).

    :meth:`load` reuses a stored reference made with the same settings, or :meth:`make_reference`
    (work for a launched reference server) produces one; :meth:`take_reference` and
    :meth:`take_second_launch` record what the reference's launches gave; :meth:`set_floor` records
    the reference against itself; :meth:`outputs` probes any server; :meth:`evaluate` turns outputs
    into a report and a gate result. Launching and stopping are the caller's
    (:func:`harvest.campaign.sweep.launch.launch_and_run`).
    """

    def __init__(self, folder: Path, reference: ServerConfig, settings: QualitySettings,
                 prompts: Sequence[ProbePrompt]):
        self.folder = Path(folder)
        self.reference_config = reference
        self.settings = settings
        self.prompts = list(prompts)
        self.protocol = protocol_for(reference, settings.probe.protocol)
        self.settings_hash = reference_hash(reference, settings.probe, self.prompts, self.protocol)
        self.reference: Reference | None = None
        #: Noise-floor reports by source (SAME_LAUNCH, SECOND_LAUNCH).
        self.floors: dict[str, QualityReport] = {}
        #: The floor the gate uses, and its source (None until measured).
        self.floor: QualityReport | None = None
        self.floor_source: str | None = None
        self.reused = False
        self._ref_task: dict[str, float] | None = None

    # --- probing a live server -----------------------------------------------------------------

    def wire(self, config: ServerConfig) -> Wire:
        """A probe client for a server, with the probe's protocol, concurrency and timeout."""
        probe = self.settings.probe
        return open_wire(config, self.protocol, concurrency=probe.concurrency, timeout=probe.request_timeout)

    async def make_reference(self, server: Fleet) -> list[ProbeOutput]:
        """On the reference server: generate and store the reference, then score it once more there."""
        async with self.wire(server.client_config) as wire:
            self.reference = await generate_reference(wire, self.prompts, self.settings.probe,
                                                      settings_hash=self.settings_hash,
                                                      server=server_settings(server.config))
            if not self.reference.entries:
                reasons = "; ".join(f"{i}: {r}" for i, r in self.reference.excluded[:3])
                raise ConfigError("probe", [("[probe]",
                                             f"the reference answered no probe prompt ({reasons})")])
            save_reference(self.folder / REFERENCE_FILE, self.reference)
            return await run_candidate(wire, self.reference, self.settings.probe)

    async def outputs(self, server: Fleet) -> list[ProbeOutput]:
        """A candidate's outputs on the reference's prompts."""
        assert self.reference is not None
        async with self.wire(server.client_config) as wire:
            return await run_candidate(wire, self.reference, self.settings.probe)

    # --- the reference and the floor -----------------------------------------------------------

    def load(self) -> bool:
        """Load a stored reference (and floors) made with the same settings; True when found."""
        ref = load_reference(self.folder / REFERENCE_FILE, self.settings_hash)
        if ref is None:
            return False
        self.reference, self.reused = ref, True
        for source in FLOOR_SOURCES:
            outputs = self._load_floor(source)
            if outputs is not None:
                self.set_floor(outputs, source, store=False)
        return True

    def _load_floor(self, source: str) -> list[ProbeOutput] | None:
        try:
            text = (self.folder / FLOOR_FILES[source]).read_text()
            lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        except (OSError, ValueError):
            return None
        if not lines or lines[0].get("settings_hash") != self.settings_hash:
            return None
        try:
            return [output_from(d) for d in lines[1:]]
        except (KeyError, TypeError, ValueError):
            return None

    def set_floor(self, outputs: Sequence[ProbeOutput], source: str, *, store: bool = True) -> QualityReport:
        """Record ``outputs`` (the reference against itself) as the floor measured by ``source``.

        The floor the gate uses is the second launch's when there is one, else the same launch's.
        """
        report = self.evaluate(outputs)[0]
        self.floors[source] = report
        best = SECOND_LAUNCH if SECOND_LAUNCH in self.floors else SAME_LAUNCH
        self.floor, self.floor_source = self.floors[best], best
        if store:
            path = self.folder / FLOOR_FILES[source]
            lines = [json.dumps(_floor_header(self.settings_hash, source))]
            with safefiles.hold(path.parent, create=True) as folder:
                folder.write_atomic(path.name, "\n".join(lines + [json.dumps(output_json(o)) for o in outputs])
                                    + "\n")
        return report

    def take_reference(self, outputs: Sequence[ProbeOutput] | None, error: str | None,
                       source: str) -> list[ProbeOutput]:
        """After the reference's launch: its rescoring in that launch (``outputs``, returned) is the
        same-launch floor. Raises ConfigError naming ``source`` (the job) when the reference did not run."""
        if outputs is None:
            raise ConfigError(source, [(f"{source} [server]", f"the reference did not run: {error}")])
        self.set_floor(outputs, SAME_LAUNCH)
        return list(outputs)

    def take_second_launch(self, outputs: Sequence[ProbeOutput] | None, error: str | None) -> str | None:
        """After the reference's second launch: its outputs are the second-launch floor; when it gave
        none, the note saying the floor comes from the reference's own launch."""
        if outputs is None:
            return (f"the second launch of the reference failed ({error}); "
                    "the floor comes from the reference's own launch")
        self.set_floor(outputs, SECOND_LAUNCH)
        return None

    @property
    def probed(self) -> int:
        """How many probe prompts the reference answered (0 before there is one)."""
        return len(self.reference.entries) if self.reference is not None else 0

    @property
    def needs_floor_launch(self) -> bool:
        return self.settings.probe.floor_launch and SECOND_LAUNCH not in self.floors

    def floor_check(self) -> tuple[QualityReport, GateResult] | None:
        """The reference against itself, gated: the second launch against the same-launch floor
        (does the reference reproduce across launches?), or the same launch against ideal agreement."""
        if SECOND_LAUNCH in self.floors:
            report = self.floors[SECOND_LAUNCH]
            return report, gate(report, self.floors.get(SAME_LAUNCH), self.settings.gate)
        if SAME_LAUNCH in self.floors:
            report = self.floors[SAME_LAUNCH]
            return report, gate(report, None, self.settings.gate)
        return None

    # --- scoring ---------------------------------------------------------------------------------

    def _reference_task(self) -> dict[str, float]:
        assert self.reference is not None
        if self._ref_task is None:
            records = task_records(self.reference, None)
            self._ref_task = dict(zip([r["id"] for r in records], run_task(self.settings.task, records)))
        return self._ref_task

    def evaluate(self, outputs: Sequence[ProbeOutput]) -> tuple[QualityReport, GateResult]:
        """The report of ``outputs`` against the reference, and the gate against the floor."""
        assert self.reference is not None
        task = None
        if self.settings.task.enabled:
            records = task_records(self.reference, outputs)
            ref = self._reference_task()
            cand = run_task(self.settings.task, records)
            task = ([ref[r["id"]] for r in records], cand)
        note = None
        if not self.reference.teacher_forcing:
            note = (f"the {self.protocol} protocol returns no prompt logprobs "
                    "(free-running greedy and task only)")
        report = quality_report(self.reference, outputs, resamples=self.settings.probe.resamples, task=task,
                                engine_note=note)
        return report, gate(report, self.floor, self.settings.gate)


__all__ = ["FLOOR_FILES", "FLOOR_SOURCES", "SAME_LAUNCH", "SECOND_LAUNCH", "QualityBench"]
