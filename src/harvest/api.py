"""harvest from Python: build or load a job, run it, read where it stands, export it.

The functions here are the ones the command line uses (``harvest run`` builds its job with
:func:`load_job`, ``harvest status`` reads :func:`status`, ``harvest export`` writes through
:func:`export`), so a notebook and a shell see the same job, the same run folder and the same
errors: harvest's own exception types (:mod:`harvest.errors`), never a ``SystemExit``.

    import harvest
    result = harvest.run("job.toml", concurrency=8)            # or harvest.run(engine="openai", ...)
    result.run_dir, result.counts                              # Path('runs/x'), {'done': 82, ...}
    result = await harvest.arun("job.toml")                    # inside a running loop (a notebook)

A run started here is the same campaign as ``harvest run``: resumable from the shell and back,
stopped cleanly by SIGINT/SIGTERM (as the command is), its servers stopped with the verified stop.
Nothing here prints; the live panel is the command line's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.config import KEYWORDS, HarvestConfig, Override, load_config, parse_config
from harvest.errors import ConfigError, HarvestError

#: The keywords that set one common setting, as the command line's flags do: name -> (table, key).
FLAGS: dict[str, tuple[str, str]] = {
    "engine": ("server", "engine"), "model": ("server", "model"), "base_url": ("server", "base_url"),
    "data": ("data", "path"), "max_tokens": ("sampling", "max_tokens"), "concurrency": ("client", "concurrency"),
    "out": ("output", "dir"),
}


@dataclass(frozen=True)
class RunResult:
    """What a run left: its folder, how it ended and the items per status (every status, zeros
    included; the ledger's counts, as ``harvest status`` reads them)."""

    run_dir: Path
    #: finished, interrupted, server_down, tripped, ... (``RunReport.outcome``).
    outcome: str
    #: It finished and every unique input item is accounted for within the limits (``harvest run``'s exit 0).
    ok: bool
    counts: Mapping[str, int]
    #: The whole report (``harvest.campaign.run.RunReport``): stops, relaunches, skip reasons, notes.
    report: Any


def overrides_of(settings: Mapping[str, Any] | None = None, **flags: Any) -> tuple[Override, ...]:
    """Keywords (``concurrency=3``) and dotted settings (``{"client.request_timeout": 30}``) as the
    overrides a job file's validation takes; an unknown keyword is a :class:`ConfigError`."""
    found: list[Override] = []
    for name, value in flags.items():
        if name not in FLAGS:
            raise ConfigError("harvest.run", [(name, f"unknown keyword; the keywords: {', '.join(FLAGS)}, "
                                                     f"and settings={{'table.key': value}} for any other")])
        if value is not None:
            found.append(Override(f"{name}=", FLAGS[name], str(value) if isinstance(value, Path) else value))
    for dotted, value in (settings or {}).items():
        path = tuple(str(dotted).split("."))
        if len(path) < 2 or not all(path):
            raise ConfigError("harvest.run", [(f"settings[{dotted!r}]", "should be 'table.key', e.g. "
                                                                        "'client.request_timeout'")])
        found.append(Override(f"settings[{dotted!r}]", path, value))
    return tuple(found)


def load_job(job: str | Path | HarvestConfig | None = None, *, settings: Mapping[str, Any] | None = None,
             **flags: Any) -> HarvestConfig:
    """A job: a file (or an already-built config), with the keywords and ``settings`` on top; or
    the keywords alone. Checked as the file is; a mistake is a :class:`ConfigError` naming it."""
    overrides = overrides_of(settings, **flags)
    if isinstance(job, HarvestConfig):
        if not overrides:
            return job
        return parse_config(job.model_dump(mode="json", exclude_none=True), source=job.source,
                            overrides=overrides)
    if job is None and not overrides:
        raise ConfigError("harvest.run", [("job", "give a job file, a config, or the job as keywords "
                                                  "(engine=, model=, data=, ...)")])
    return load_config(job, overrides, source=KEYWORDS)


async def arun(job: str | Path | HarvestConfig | None = None, *, settings: Mapping[str, Any] | None = None,
               allow_mixed: bool = False, force: bool = False, retry: Iterable[str] = (),
               **flags: Any) -> RunResult:
    """Run or resume a job inside the running event loop (a notebook's, an application's). The
    keywords are :func:`load_job`'s and ``harvest run``'s switches. The loop is never held up by
    the run (its ledger, its files and the first import of its modules are worked on threads).
    Cancelling the task that awaits it is a clean stop, as SIGINT is: the items in flight go back
    to pending and a server harvest launched gets its verified stop; then ``CancelledError``."""
    config = load_job(job, settings=settings, **flags)
    # The campaign's modules are imported, the placement chosen and the counts read on a worker
    # thread: the loop this runs in (a notebook's, an application's) is never held up by them.
    run_campaign, placement = await asyncio.to_thread(_campaign_for, config)
    report = await run_campaign(config, placement=placement, allow_mixed=allow_mixed, force=force,
                                retry=tuple(retry))
    counts = await asyncio.to_thread(_counts_of, report)
    return RunResult(run_dir=Path(report.run_dir), outcome=report.outcome, ok=report.ok, counts=counts,
                     report=report)


def _campaign_for(config: HarvestConfig) -> tuple[Any, Any]:
    """``run_campaign`` and the job's placement (importing the campaign takes a while, once)."""
    from harvest.campaign.run import run_campaign
    from harvest.placement import from_config

    return run_campaign, from_config(config)


def _counts_of(report: Any) -> dict[str, int]:
    """The items per status of the run a report is of, read through the folder it held."""
    from harvest.campaign.outputs.status import run_status

    held = report.folder  # read through it: a folder swapped in for the name is not this run's
    try:
        return {s.value: n for s, n in run_status(held.via() if held is not None else report.run_dir).counts.items()}
    finally:
        if held is not None:
            held.close()


def run(job: str | Path | HarvestConfig | None = None, *, settings: Mapping[str, Any] | None = None,
        allow_mixed: bool = False, force: bool = False, retry: Iterable[str] = (), **flags: Any) -> RunResult:
    """Run or resume a job and wait for it; :func:`arun` where an event loop is already running."""
    from harvest import aio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return aio.run(arun(job, settings=settings, allow_mixed=allow_mixed, force=force, retry=retry, **flags))
    raise HarvestError("harvest.run() was called inside a running event loop (a notebook, an async "
                       "application): use `await harvest.arun(...)` there")


def status(run_dir: str | Path, *, errors_limit: int = 10) -> Any:
    """Where a run stands, as ``harvest status`` reads it: a ``RunStatus`` with ``counts`` (per
    ``harvest.ledger.Status``), ``totals``, ``throughput``, ``eta_s`` and the latest errors. A
    folder without a readable ledger is a :class:`harvest.errors.LedgerError`."""
    from harvest.campaign.outputs.status import run_status

    return run_status(run_dir, errors_limit=errors_limit)


def export(run_dir: str | Path, format: str = "sharegpt", *, output: str | Path | None = None,
           statuses: str | Iterable[str] = (), allow_empty: bool = False, **options: Any) -> Any:
    """Write the run's results of ``statuses`` (one status, ``"done,truncated"``, or a sequence)
    to ``output`` (default: in the run folder) in ``format`` (``harvest export --format``: sharegpt,
    openai-batch, parquet, logprobs, specforge), as ``harvest export`` does (no ``statuses``: ``done``;
    for openai-batch every item that ended: done, truncated, failed, skipped): an ``ExportReport`` with
    ``path``, ``written`` and ``malformed``. Selecting no item writes nothing and raises
    :class:`harvest.errors.NothingToExport` (what the run holds, the fix), as the command exits 1;
    ``allow_empty=True`` writes the empty file. ``options``: ``sharegpt_style``, ``row_group_size``."""
    from harvest.campaign.outputs.export import export_run, nothing_selected, selected_statuses
    from harvest.errors import NothingToExport

    wanted = selected_statuses(format, statuses)
    report = export_run(run_dir, format, output=output, statuses=wanted, allow_empty=allow_empty, **options)
    if not report.kept:
        raise NothingToExport(nothing_selected(run_dir, format, wanted, report, flags=False), report)
    return report


__all__ = ["FLAGS", "RunResult", "arun", "export", "load_job", "overrides_of", "run", "status"]
