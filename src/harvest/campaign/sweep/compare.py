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

The pieces (:class:`QualityBench`, :func:`launch_and_run`) are shared with ``harvest tune``. This
module never signals a process itself: launches and stops go through the server factory.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harvest import safefiles
from harvest.config import HarvestConfig, PreflightConfig, ServerConfig
from harvest.errors import ConfigError, LaunchError, PreflightFailed, RequestError, ServerSick
from harvest.events import Listener
from harvest.gpu.preflight import GPU_MEMORY, HOST_RAM
from harvest.placement import Fleet, FleetFactory, OnPreflight, Placement, from_config
from harvest.quality.evaluate import GateResult, QualityReport, gate, quality_report, task_records
from harvest.quality.policy import violations
from harvest.quality.probe import ProbePrompt, select_prompts
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
    save_outputs,
    save_reference,
    server_settings,
)
from harvest.quality.settings import QualitySettings
from harvest.quality.task import run_task
from harvest.quality.wire import Wire, open_wire, protocol_for
from harvest.server import hold_index
from harvest.stops import StopReport

log = logging.getLogger("harvest.compare")

#: Preflight rules whose failure means "not enough memory for these settings".
MEMORY_RULES = frozenset({GPU_MEMORY, HOST_RAM})

#: Sources of a noise floor: a second launch of the reference, or a rescoring in its own launch.
SECOND_LAUNCH = "second launch"
SAME_LAUNCH = "same launch"
FLOOR_SOURCES = (SAME_LAUNCH, SECOND_LAUNCH)
FLOOR_FILES = {SAME_LAUNCH: "floor-same-launch.jsonl", SECOND_LAUNCH: "floor-second-launch.jsonl"}
COMPARE_SCHEMA = "harvest.compare/1"
T = TypeVar("T")


@dataclass(frozen=True)
class Launch:
    """How one launch went: ready time, KV capacity, the stop, and why it failed if it did."""

    label: str
    run_dir: str | None
    ready_s: float | None = None
    kv_capacity_tokens: int | None = None
    stop: StopReport | None = None
    #: Why the launch or the work on the server failed (None when both went well).
    error: str | None = None
    #: ``preflight``, a :class:`LaunchError` reason (``out_of_memory``, ``exited``, ``unsupported``, ...),
    #: ``server_sick`` or ``request``; None when nothing failed.
    reason: str | None = None
    #: The failure was for lack of memory (out of memory at start, or a preflight memory rule).
    memory_bound: bool = False

    @property
    def stopped_clean(self) -> bool:
        """True when nothing needed stopping or the stop measured everything gone."""
        return self.stop is None or self.stop.clean

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "run_dir": self.run_dir, "ready_s": self.ready_s,
                "kv_capacity_tokens": self.kv_capacity_tokens, "error": self.error, "reason": self.reason,
                "memory_bound": self.memory_bound,
                "stop": None if self.stop is None else {"verdict": self.stop.verdict,
                                                        "total_s": self.stop.total_s,
                                                        "escalated": self.stop.escalated,
                                                        "problems": list(self.stop.problems)}}


async def launch_and_run(label: str, config: ServerConfig, run_dir: Path,
                         work: Callable[[Fleet], Awaitable[T]], *,
                         preflight: PreflightConfig | None = None, force: bool = False,
                         on_preflight: OnPreflight | None = None,
                         on_event: Listener | None = None,
                         server_factory: FleetFactory) -> tuple[T | None, Launch]:
    """Launch ``config``, run ``work(server)``, then the verified stop -- always, whatever failed.

    ``server_factory`` makes the server (the fleets of a placement, ``placement.fleet(probe=True)``);
    ``work`` reaches it at ``server.client_config``. Launch and
    server failures are recorded in the returned :class:`Launch`, not raised; ``ConfigError`` (the user's configuration, e.g. a task scorer) and
    ``RemoteError`` (a far host that cannot be reached or checked) propagate after the stop.
    """
    server = server_factory(config, run_dir=run_dir / "server", preflight=preflight, force=force,
                            on_preflight=on_preflight, on_event=on_event)
    log.info("%s: launching %s (run dir %s)", label, config.engine, server.run_dir)
    t0 = time.monotonic()
    try:
        await server.start()
    except PreflightFailed as exc:
        failed = set(exc.failed_rules)
        return None, Launch(label, str(server.run_dir), error=str(exc), reason="preflight",
                            stop=server.stop_report,
                            memory_bound=bool(failed & MEMORY_RULES))
    except LaunchError as exc:
        first = str(exc).splitlines()[0]
        return None, Launch(label, str(server.run_dir), error=first, reason=exc.reason or "exited",
                            stop=server.stop_report, memory_bound=exc.reason == "out_of_memory")
    ready_s = round(time.monotonic() - t0, 2)
    result: T | None = None
    error = reason = None
    try:
        result = await work(server)
    except ServerSick as exc:
        error, reason = f"the server failed during the probe: {exc}", "server_sick"
    except RequestError as exc:
        error, reason = f"a probe request failed: {exc}", "request"
    finally:
        await server.stop()
        stop = server.stop_report  # a probe fleet holds one server: its verified stop
    log.info("%s: ready in %.1f s, %s; stop %s", label, ready_s, error or "probed",
             stop.verdict if stop is not None else "not needed")
    return result, Launch(label, str(server.run_dir), ready_s, server.kv_capacity_tokens, stop, error, reason)


def _floor_header(settings_hash: str, source: str) -> dict[str, Any]:
    return {"schema": "harvest.floor/1", "settings_hash": settings_hash, "source": source}


class QualityBench:
    """The probe set, the reference and the noise floor of one comparison folder.

    :meth:`load` reuses a stored reference made with the same settings, or :meth:`make_reference`
    (work for a launched reference server) produces one; :meth:`set_floor` records the reference
    against itself; :meth:`outputs` probes any server; :meth:`evaluate` turns outputs into a report
    and a gate result. Launching and stopping are the caller's (see :func:`launch_and_run`).
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


# --- harvest compare ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRow:
    """One compared server: the floor (the reference against itself) or a candidate."""

    label: str
    settings: dict[str, Any]
    #: "pass", "fail", "rejected" (policy; never launched), "failed" (launch, probe or stop
    #: failed), or "not run" (an earlier dirty stop ended the comparison).
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


@dataclass(frozen=True)
class CompareReport:
    out_dir: Path
    reference: dict[str, Any]
    prompts: int
    floor_source: str | None
    reused_reference: bool
    rows: tuple[CompareRow, ...]
    launches: tuple[Launch, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        """Every candidate passed (the floor row is not a candidate)."""
        return all(r.verdict == "pass" for r in self.rows if r.label != "floor")

    @property
    def all_stops_clean(self) -> bool:
        return all(launch.stopped_clean for launch in self.launches)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": COMPARE_SCHEMA, "out_dir": str(self.out_dir), "reference": self.reference,
                "prompts": self.prompts, "floor_source": self.floor_source,
                "reused_reference": self.reused_reference, "passed": self.passed,
                "rows": [r.to_dict() for r in self.rows], "launches": [x.to_dict() for x in self.launches],
                "notes": list(self.notes)}


def settings_diff(base: ServerConfig, other: ServerConfig) -> dict[str, Any]:
    """The output- or memory-relevant server fields of ``other`` that differ from ``base``."""
    a, b = server_settings(base), server_settings(other)
    return {k: v for k, v in b.items() if a.get(k) != v}


def dirty_problems(launch: Launch) -> str:
    return "; ".join(launch.stop.problems) if launch.stop is not None and launch.stop.problems else "dirty"


def row_from(label: str, settings: dict[str, Any], launch: Launch,
             evaluated: tuple[QualityReport, GateResult] | None) -> CompareRow:
    """A row from a launch and its evaluation (None when the launch or probe failed).

    A launch whose stop was dirty is "failed" whatever it measured: its setting leaves processes or
    memory behind. A launch the engine refused because this machine cannot run the setting (reason
    ``unsupported``, e.g. an FP8 KV cache on a CPU without AVX-512) is "unsupported": a configuration
    problem of that setting here, not a crash.
    """
    stop = () if launch.stopped_clean else (f"dirty stop: {dirty_problems(launch)}",)
    if launch.reason == "unsupported" and not stop:
        return CompareRow(label, settings, "unsupported", launch,
                          reasons=(f"not supported on this machine: {launch.error}",))
    if evaluated is None or launch.error is not None:
        return CompareRow(label, settings, "failed", launch, reasons=stop + (launch.error or "no outputs",))
    report, result = evaluated
    reasons = stop + tuple(str(c) for c in result.failures)
    verdict = "failed" if stop else ("pass" if result.passed else "fail")
    return CompareRow(label, settings, verdict, launch, report, result, reasons)


class _Comparison:
    """One ``harvest compare``: its launches in order, the rows and notes they give. Not reusable."""

    def __init__(self, reference: HarvestConfig, placement: Placement, bench: QualityBench, out_dir: Path,
                 force: bool, on_preflight: OnPreflight | None):
        self.reference, self.placement, self.bench, self.out_dir = reference, placement, bench, out_dir
        self.ref_cfg = reference.require_server()
        self.force, self.on_preflight = force, on_preflight
        self.launches: list[Launch] = []
        self.rows: list[CompareRow] = []
        self.notes: list[str] = []
        self.dirty = False  # a stop was not clean: nothing further is launched
        self._counter = iter(range(1000))
        self.ref_factory = placement.fleet(probe=True)
        note = placement.note(True)
        if note is not None:
            self.notes.append(note)

    async def launch(self, label: str, cfg: ServerConfig, pf: PreflightConfig, work: Callable[[Fleet], Awaitable[T]],
                     factory: FleetFactory | None = None) -> tuple[T | None, Launch]:
        """One launch in its own numbered folder; a dirty stop ends the launching."""
        folder = self.out_dir / "launches" / f"{next(self._counter):02d}-{label}"
        result, launch = await launch_and_run(label, cfg, folder, work, preflight=pf, force=self.force,
                                              on_preflight=self.on_preflight,
                                              server_factory=factory or self.ref_factory)
        self.launches.append(launch)
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
        if outputs is None:
            raise ConfigError(self.reference.source, [(f"{self.reference.source} [server]",
                                                       f"the reference did not run: {launch.error}")])
        self.bench.set_floor(outputs, SAME_LAUNCH)

    async def floor(self) -> None:
        """The noise floor: a second launch of the reference when asked for, else its own launch."""
        floor_launch = None
        if self.bench.needs_floor_launch and not self.dirty:
            outputs, floor_launch = await self.launch("floor", self.ref_cfg, self.reference.preflight,
                                                      self.bench.outputs)
            if outputs is not None:
                self.bench.set_floor(outputs, SECOND_LAUNCH)
            else:
                self.notes.append(f"the second launch of the reference failed ({floor_launch.error}); "
                                  "the floor comes from the reference's own launch")
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
        report = CompareReport(self.out_dir, server_settings(self.ref_cfg),
                               len(bench.reference.entries) if bench.reference else 0,
                               bench.floor_source, bench.reused, tuple(self.rows), tuple(self.launches),
                               tuple(self.notes))
        with safefiles.hold(self.out_dir, create=True) as folder:
            folder.write_atomic("compare.json", json.dumps(report.to_dict(), indent=2) + "\n")
        return report


async def compare(reference: HarvestConfig, candidates: Sequence[HarvestConfig], *, settings: QualitySettings,
                  out_dir: Path, placement: Placement, force: bool = False,
                  on_preflight: OnPreflight | None = None,
                  prompts: Sequence[ProbePrompt] | None = None) -> CompareReport:
    """Compare each candidate's [server] with the reference's on the probe set (module docstring).

    ``placement``: where the reference runs, as the command chose it. ``prompts`` overrides the probe set (else it is drawn from the reference job's
    [data] and ``[probe] file``). Raises ConfigError when the reference cannot be produced.
    """
    out_dir = Path(out_dir)
    ref_cfg = reference.require_server()
    # Refused before any launch: a compare folder another user owns or can rename, a foreign state dir.
    safefiles.hold(out_dir, create=True).close()
    hold_index().close()
    if prompts is None:
        probe = settings.probe
        prompts = select_prompts(reference.data, n=probe.prompts, seed=probe.seed, extra=probe.file)
    run = _Comparison(reference, placement,
                      QualityBench(out_dir, ref_cfg, settings, prompts), out_dir, force, on_preflight)
    await run.make_reference()
    await run.floor()
    for i, cand in enumerate(candidates):
        await run.candidate(f"candidate-{i + 1}", cand)
    return run.report()


__all__ = [
    "COMPARE_SCHEMA",
    "FLOOR_FILES",
    "SAME_LAUNCH",
    "SECOND_LAUNCH",
    "CompareReport",
    "CompareRow",
    "Launch",
    "QualityBench",
    "compare",
    "dirty_problems",
    "launch_and_run",
    "row_from",
    "settings_diff",
]
