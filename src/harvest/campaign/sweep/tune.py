"""Sweep server settings under a quality gate and pick the fastest that passes: ``harvest tune``.

    tune_file = load_tune_file("tune.toml")
    report = await tune(job, tune_file, placement=from_config(job))  # default folder: <job output.dir>/tune
    report.best                                              # the fastest passing trial, or None

The trials are the cartesian product of each ``[grid]`` table (or of each ``[[grid]]`` table,
joined), applied on top of the job's ``[server]``. The reference is the job's ``[server]`` with the
``[reference]`` overrides. The reference, its noise floor and the probe set are prepared as for
``harvest compare`` (:mod:`harvest.campaign.sweep.bench`) and stored in the tune folder, so a later
sweep with the same reference settings reuses them. When the reference settings are also a trial,
the reference launch measures that trial's throughput too (one launch less).

Each trial, in order:

    policy      a setting that breaks a ``[policy] forbid`` rule is rejected, never launched (no folder)
    memory      a setting that can only need as much memory as a trial that already failed for lack of
                memory (see :func:`harvest.quality.policy.needs_at_least`) is skipped, never launched
    launch      preflight -> spawn -> ready (a failure at start is recorded with its reason; the sweep
                goes on)
    quality     the probe set, scored against the reference and gated against the noise floor
    throughput  a fixed sample of the job's prompts at saturating concurrency
                (:mod:`harvest.quality.throughput`)
    stop        the verified stop; its StopReport must be clean before the next launch. A dirty stop
                makes the trial "failed" (its setting leaves processes or memory behind) and, with
                ``[sweep] on_dirty_stop = "abort"`` (the default), ends the sweep: every later trial
                is "not run", since what was left behind would fail or skew it.

Results go to ``tune.json`` and ``tune.csv`` in the tune folder. Verdicts: ``pass``, ``fail``
(quality gate), ``rejected`` (policy), ``skipped`` (memory order), ``unsupported`` (the engine
says this machine cannot run the setting; the sweep goes on), ``failed`` (launch, probe or stop
failed), ``not run``. The best trial is the passing one with the highest generation tok/s.
With ``[host]`` each trial's server runs on the far host (launched, and stopped with verification,
by the far harvest) and the probes run from here through the tunnel; with ``[[hosts]]`` the
trials run on the first host (a note says so). This module never signals a process itself:
launches and stops go through the fleets of the placement the command chose
(:meth:`harvest.placement.Placement.fleet` with ``probe=True``).
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from harvest import safefiles
from harvest.campaign.sweep.bench import QualityBench
from harvest.campaign.sweep.launch import Launch, Launches, dirty_problems, judge
from harvest.campaign.sweep.report import SweepReport
from harvest.campaign.sweep.tune_file import TuneFile
from harvest.config import HarvestConfig, ServerConfig
from harvest.errors import ConfigError
from harvest.events import Listener, emit
from harvest.placement import Fleet, OnPreflight, Placement
from harvest.quality.evaluate import GateResult, QualityReport
from harvest.quality.policy import needs_at_least, violations
from harvest.quality.probe import select_prompts
from harvest.quality.reference import ProbeOutput, save_outputs, server_settings
from harvest.quality.throughput import ThroughputResult, throughput_probe
from harvest.redact import redact_server_settings
from harvest.server.state import hold_index

TUNE_SCHEMA = "harvest.tune/1"
TUNE_DIR = "tune"
T = TypeVar("T")


# --- trials ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One point of the grid: the overrides and the server config they make."""

    index: int
    overrides: dict[str, Any]
    config: ServerConfig

    @property
    def label(self) -> str:
        parts = [f"{k}-{'_'.join(map(str, v)) if isinstance(v, list) else v}"
                 for k, v in redact_server_settings(self.overrides).items()]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts)).strip("_")[:60] or "job"
        return f"{self.index:02d}-{slug}"


def _with(base: ServerConfig, updates: dict[str, Any], source: str) -> ServerConfig:
    try:
        return ServerConfig.model_validate({**base.model_dump(), **updates})
    except ValidationError as exc:
        shown = _shown(updates, str(updates.get("engine", base.engine)))
        problems = [(f"{source} [grid] " + ".".join(str(p) for p in e["loc"]), f"{e['msg']} (in {shown})")
                    for e in exc.errors()]
        raise ConfigError(source, problems) from None


def _shown(updates: dict[str, Any], engine: str) -> dict[str, Any]:
    """A grid point fit to echo: the value of a secret flag in ``extra_args``/``command``, in any
    spelling the engine reads as one (``--api-ke KEY``), and secret-named variables as ``***``."""
    from harvest.engine_flags import hide_secret_values

    out = dict(updates)
    for name in ("extra_args", "command"):
        if isinstance(out.get(name), list):
            argv = [str(a) for a in out[name]]
            out[name] = hide_secret_values(engine if name == "extra_args" else None, argv)
    return redact_server_settings(out)


def expand_grid(base: ServerConfig, tune_file: TuneFile) -> list[Trial]:
    """Every distinct trial of the grid, in declaration order (sampled down to ``max_trials``)."""
    combos: list[dict[str, Any]] = []
    for table in tune_file.grid or [{}]:
        keys = list(table)
        for values in itertools.product(*(table[k] for k in keys)):
            combos.append(dict(zip(keys, values)))
    trials: list[tuple[dict[str, Any], ServerConfig]] = []
    seen: list[ServerConfig] = []
    for combo in combos:
        cfg = _with(base, combo, tune_file.source)
        if cfg not in seen:
            seen.append(cfg)
            trials.append((combo, cfg))
    limit = tune_file.sweep.max_trials
    if limit is not None and len(trials) > limit:
        keep = sorted(random.Random(tune_file.sweep.sample_seed).sample(range(len(trials)), limit))
        trials = [trials[i] for i in keep]
    return [Trial(i + 1, combo, cfg) for i, (combo, cfg) in enumerate(trials)]


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured, and its verdict."""

    index: int
    label: str
    overrides: dict[str, Any]
    #: One of :data:`~harvest.campaign.sweep.report.TRIAL_VERDICTS`.
    verdict: str
    reasons: tuple[str, ...] = ()
    is_reference: bool = False
    launch: Launch | None = None
    quality: QualityReport | None = None
    gate: GateResult | None = None
    throughput: ThroughputResult | None = None
    config: ServerConfig | None = field(default=None, compare=False)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def row(self) -> dict[str, Any]:
        """The flat row of the table and the CSV."""
        q = self.quality.metrics() if self.quality is not None else {}
        t = self.throughput

        def value(name: str) -> float | None:
            e = q.get(name)
            return round(e.value, 6) if e is not None and e.value == e.value else None

        kv = t.kv_capacity_tokens if t is not None else None
        if kv is None and self.launch is not None:
            kv = self.launch.kv_capacity_tokens
        return {
            "trial": self.index, "settings": json.dumps(redact_server_settings(self.overrides), sort_keys=True),
            "reference": self.is_reference, "kv_tokens": kv,
            "peak_running": t.peak_running if t else None, "gen_tok_s": t.gen_tok_s if t else None,
            "gen_tok_s_metrics": t.gen_tok_s_metrics if t else None,
            "top1_agreement": value("top1_agreement"), "mean_kl": value("mean_kl"),
            "mean_abs_delta_logprob": value("mean_abs_delta_logprob"),
            "p99_abs_delta_logprob": value("p99_abs_delta_logprob"), "exact_match": value("exact_match"),
            "mean_first_divergence": value("mean_first_divergence"), "task_score": value("task_score"),
            "verdict": self.verdict,
            "stop": (self.launch.stop.verdict if self.launch and self.launch.stop else None),
            "reasons": "; ".join(self.reasons),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "overrides": redact_server_settings(self.overrides),
                "verdict": self.verdict,
                "reasons": list(self.reasons), "is_reference": self.is_reference,
                "launch": self.launch.to_dict() if self.launch else None,
                "quality": self.quality.to_dict() if self.quality else None,
                "gate": self.gate.to_dict() if self.gate else None,
                "throughput": self.throughput.to_dict() if self.throughput else None,
                "server": server_settings(self.config) if self.config is not None else None}


@dataclass(frozen=True, kw_only=True)
class TuneReport(SweepReport):
    """A sweep: its facts, each trial's result (in grid order), and whether a dirty stop ended it."""

    trials: tuple[TrialResult, ...]
    aborted: bool = False
    #: The floor the gate used (None when none was measured).
    floor: QualityReport | None = None

    @property
    def best(self) -> TrialResult | None:
        """The passing trial with the highest generation tok/s (None when none passed)."""
        passing = [t for t in self.trials if t.passed and t.throughput is not None]
        return max(passing, key=lambda t: t.throughput.gen_tok_s, default=None)  # type: ignore[union-attr]

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {**self.head(TUNE_SCHEMA), "floor": self.floor.to_dict() if self.floor else None,
                "reused_reference": self.reused_reference, "aborted": self.aborted,
                "best": best.index if best else None, "trials": [t.to_dict() for t in self.trials],
                **self.tail()}


def write_results(report: TuneReport) -> tuple[Path, Path]:
    """``tune.json`` and ``tune.csv`` in the tune folder."""
    rows = [t.row() for t in report.trials]
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["trial"])
    writer.writeheader()
    writer.writerows(rows)
    with safefiles.hold(report.out_dir, create=True) as folder:
        json_path = folder.write_atomic("tune.json", json.dumps(report.to_dict(), indent=2) + "\n")
        csv_path = folder.write_atomic("tune.csv", buf.getvalue())
    return json_path, csv_path


# --- the sweep ---------------------------------------------------------------------------------------


def default_out_dir(job: HarvestConfig) -> Path:
    return Path(job.output.dir) / TUNE_DIR


def reference_config(job: HarvestConfig, tune_file: TuneFile) -> ServerConfig:
    base = job.require_server()
    return _with(base, tune_file.reference, tune_file.source) if tune_file.reference else base


class _Sweep:
    """One sweep. Not reusable."""

    def __init__(self, job: HarvestConfig, tune_file: TuneFile, out_dir: Path, placement: Placement, *,
                 force: bool, on_preflight: OnPreflight | None,
                 on_trial: Callable[[TrialResult], None] | None, on_event: Listener | None):
        self.job, self.tf, self.out_dir = job, tune_file, out_dir
        self.on_trial, self.on_event = on_trial, on_event
        self.launch_total = 0  # the launches the sweep plans (for the display)
        self.ref_cfg = reference_config(job, tune_file)
        probe = tune_file.probe
        self.prompts = select_prompts(job.data, n=probe.prompts, seed=probe.seed, extra=probe.file)
        tp = tune_file.throughput
        self.load_prompts = select_prompts(job.data, n=tp.prompts, seed=tp.seed)
        self.bench = QualityBench(out_dir, self.ref_cfg, tune_file.quality, self.prompts)
        self.launches = Launches(placement, force=force, on_preflight=on_preflight, on_event=on_event)
        self.results: list[TrialResult] = []
        self.notes = self.launches.notes  # the placement's note first, then the sweep's
        self.aborted = False
        self._pending: tuple[Trial, Launch, list[ProbeOutput], ThroughputResult | None] | None = None

    async def _throughput(self, server: Fleet) -> ThroughputResult:
        return await throughput_probe(server.client_config, self.load_prompts, self.tf.throughput,
                                      sampling=self.job.sampling, metrics=server.adapter.metrics,
                                      kv_capacity=server.kv_capacity_tokens)

    async def _launch(self, folder: Path, label: str, cfg: ServerConfig,
                      work: Callable[[Fleet], Awaitable[T]]) -> tuple[T | None, Launch]:
        index = len(self.launches.done) + 1
        emit(self.on_event, "trial", "start", index=index, of=max(self.launch_total, index), label=label)

        async def reported(server: Fleet) -> T:
            emit(self.on_event, "trial", "update", step="probing quality and throughput")
            return await work(server)

        result, launch = await self.launches.run(label, cfg, folder, reported, preflight=self.job.preflight)
        emit(self.on_event, "trial", "update", step="done" if result is not None else f"failed: {launch.reason}")
        return result, launch

    def _record(self, result: TrialResult) -> None:
        self.results.append(result)
        if self.on_trial is not None:
            self.on_trial(result)

    def _dirty(self, launch: Launch) -> bool:
        """True when the sweep must end after this launch's stop."""
        if launch.stopped_clean:
            return False
        self.notes.append(f"the stop of {launch.label} was dirty: {dirty_problems(launch)}")
        return self.tf.sweep.on_dirty_stop == "abort"

    async def prepare(self, trials: Sequence[Trial]) -> Trial | None:
        """Load or make the reference (and floor); returns the trial the reference launch measured."""
        if self.bench.load():
            self.launch_total += int(self.bench.needs_floor_launch)
            return None
        ref_trial = next((t for t in trials if t.config == self.ref_cfg), None)
        self.launch_total += int(ref_trial is None) + int(self.bench.needs_floor_launch)

        async def work(server: Fleet) -> tuple[list[ProbeOutput], ThroughputResult | None]:
            outputs = await self.bench.make_reference(server)
            return outputs, (await self._throughput(server) if ref_trial is not None else None)

        folder = self.out_dir / "trials" / ref_trial.label if ref_trial else self.out_dir / "reference"
        result, launch = await self._launch(folder, "reference", self.ref_cfg, work)
        got, load = result if result is not None else (None, None)
        outputs = self.bench.take_reference(got, launch.error, self.job.source)
        if ref_trial is not None:
            self._pending = (ref_trial, launch, outputs, load)
        if self._dirty(launch):
            self.aborted = True
        return ref_trial

    def record_reference_trial(self) -> None:
        """The trial the reference launch measured, once the floor is final. It shows its rescoring
        in its own launch, and its verdict is the one ``harvest compare`` gives its floor row: does
        the reference reproduce itself (the second launch against the same-launch floor, or without
        a second launch, the same launch against ideal agreement)? Gated against the second launch
        like a candidate, an engine that reproduces across launches and not within one failed its
        own reference (transformers serve on the H200: a second launch matched exactly, a rerun in
        the reference's own launch 0.625), while candidates, each the first probe of a fresh launch,
        are judged against the floor of the same situation."""
        if self._pending is None:
            return
        trial, launch, outputs, load = self._pending
        quality, against_floor = self.bench.evaluate(outputs)
        checked = self.bench.floor_check()
        judged = judge(launch, (quality, checked[1] if checked else against_floor))
        self._record(TrialResult(trial.index, trial.label, trial.overrides, judged.verdict, judged.reasons,
                                 True, launch, judged.quality, judged.gate, load, trial.config))

    async def floor(self) -> None:
        if self.aborted or not self.bench.needs_floor_launch:
            return
        outputs, launch = await self._launch(self.out_dir / "floor", "floor", self.ref_cfg,
                                             self.bench.outputs)
        failed = self.bench.take_second_launch(outputs, launch.error)
        if failed is not None:
            self.notes.append(failed)
        if self._dirty(launch):
            self.aborted = True

    async def trial(self, trial: Trial) -> None:
        result_of = functools.partial(TrialResult, index=trial.index, label=trial.label,
                                      overrides=trial.overrides, is_reference=trial.config == self.ref_cfg,
                                      config=trial.config)
        if self.aborted:
            self._record(result_of(verdict="not run", reasons=("the sweep ended after a dirty stop",)))
            return
        broken = violations(trial.config, self.tf.policy)
        if broken:
            self._record(result_of(verdict="rejected", reasons=tuple(broken)))
            return
        for earlier in self.results:
            if (earlier.launch is not None and earlier.launch.memory_bound and earlier.config is not None
                    and needs_at_least(trial.config, earlier.config)):
                why = (f"needs at least the memory of trial {earlier.index}, "
                       f"which failed: {earlier.launch.reason}")
                self._record(result_of(verdict="skipped", reasons=(why,)))
                return

        async def work(server: Fleet) -> tuple[list[ProbeOutput], ThroughputResult]:
            outputs = await self.bench.outputs(server)
            return outputs, await self._throughput(server)

        folder = self.out_dir / "trials" / trial.label
        got, launch = await self._launch(folder, trial.label, trial.config, work)
        if got is None:
            judged = judge(launch, None)
            self._record(result_of(verdict=judged.verdict, reasons=judged.reasons, launch=launch))
        else:
            outputs, load = got
            save_outputs(folder / "outputs.jsonl", outputs)
            judged = judge(launch, self.bench.evaluate(outputs))
            self._record(result_of(verdict=judged.verdict, reasons=judged.reasons, launch=launch,
                                     quality=judged.quality, gate=judged.gate, throughput=load))
        if self._dirty(launch):
            self.aborted = True

    async def run(self) -> TuneReport:
        trials = expand_grid(self.job.require_server(), self.tf)
        # Launches planned (at most: a trial may be skipped): each not rejected by policy, plus
        # the reference and its floor as prepare() finds them needed.
        self.launch_total = len([t for t in trials if not violations(t.config, self.tf.policy)])
        measured = await self.prepare(trials)
        await self.floor()
        self.record_reference_trial()
        for trial in trials:
            if measured is not None and trial.index == measured.index:
                continue
            await self.trial(trial)
        self.results.sort(key=lambda r: r.index)
        bench = self.bench
        report = TuneReport(out_dir=self.out_dir, reference=server_settings(self.ref_cfg),
                            prompts=bench.probed, floor_source=bench.floor_source,
                            reused_reference=bench.reused, launches=tuple(self.launches.done),
                            notes=tuple(self.notes), trials=tuple(self.results), aborted=self.aborted,
                            floor=bench.floor)
        write_results(report)
        return report


async def tune(job: HarvestConfig, tune_file: TuneFile, *, placement: Placement,
               out_dir: Path | None = None, force: bool = False,
               on_preflight: OnPreflight | None = None,
               on_trial: Callable[[TrialResult], None] | None = None,
               on_event: Listener | None = None) -> TuneReport:
    """Run the sweep of ``tune_file`` over ``job``'s server (see the module docstring), each trial
    where ``placement`` puts it (as the command chose it)."""
    if job.server is None or not job.server.launched:
        raise ConfigError(job.source, [(f"{job.source} [server]",
                                        "`harvest tune` needs a [server] it launches")])
    out = Path(out_dir) if out_dir else default_out_dir(job)
    expand_grid(job.server, tune_file)  # a grid point the config refuses (a secret flag) ends it before a folder exists
    # Refused before any launch: a tune folder another user owns or can rename, a foreign state dir.
    safefiles.hold(out, create=True).close()
    hold_index().close()
    return await _Sweep(job, tune_file, out, placement, force=force, on_preflight=on_preflight, on_trial=on_trial,
                        on_event=on_event).run()


def job_with_server(job: HarvestConfig, server: ServerConfig) -> HarvestConfig:
    """The job with its [server] replaced (what ``--then-run`` runs)."""
    return job.model_copy(update={"server": server})


__all__ = [
    "TUNE_SCHEMA",
    "Trial",
    "TrialResult",
    "TuneReport",
    "default_out_dir",
    "expand_grid",
    "job_with_server",
    "reference_config",
    "tune",
    "write_results",
]
