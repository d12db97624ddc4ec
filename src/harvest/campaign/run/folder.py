"""What a run folder holds, said to a person: which job it belongs to, what a session found in it,
and whether its skipped rows or its failed items fail the run.

    other_job(run_dir, settings, data_path)   # why the folder is another job's (settings named), or None
    job_change(run_dir, settings, data_path)  # the same, as an OtherJob: its refusal, or the line of a take-over
    resume_line(counts, recovered, ingest, ingesting)   # "resuming: 470 done, 1530 pending; ..."
    skipped_problem(totals, max_share)         # no row, every row skipped, more than the share, or None
    failed_problem(totals, max_share)          # more items failed than the share, or None

It reads the ledger read-only and only formats; the runner decides what to do with the answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.errors import LedgerError
from harvest.ledger import LEDGER_FILE, Ledger, Status, Totals, hash_settings
from harvest.redact import redact_doc


def resume_line(counts: dict[Status, int], recovered: int, ingest: dict[str, Any], ingesting: bool) -> str:
    """What a session found in an existing run folder and what it will do, in one line:
    ``resuming: 470 done, 1530 pending (12 truncated, 3 failed); generating the 1530 pending``."""
    done, pending = counts[Status.DONE], counts[Status.PENDING] + counts[Status.RUNNING]
    others = [f"{counts[s]:,} {s.value}" for s in (Status.TRUNCATED, Status.FAILED, Status.SKIPPED) if counts[s]]
    line = f"resuming: {done:,} done, {pending:,} pending" + (f" ({', '.join(others)})" if others else "")
    if recovered:
        line += f"; {recovered:,} left running by an interrupted session are pending again"
    todo = []
    if pending:
        todo.append(f"generating the {pending:,} pending")
    if ingesting or not ingest.get("complete", True):
        todo.append(f"reading the dataset on after row {ingest.get('rows', 0):,}")
    return line + "; " + (" and ".join(todo) if todo else "nothing left to do")


def skipped_problem(totals: Totals, max_share: float, source: str | None = None) -> str | None:
    """Why the input fails the run, else None: no row at all (an empty file, a folder without rows:
    most likely the wrong file; ``source`` names it), every row skipped, or more than ``max_share``."""
    skipped, unique = totals.counts[Status.SKIPPED], totals.unique
    if not unique and totals.ingest_complete and not totals.input_rows:
        where = f" ({source})" if source else ""
        return f"the dataset{where} has no rows: nothing was generated"
    if not unique or not skipped:
        return None
    if skipped == unique:
        return f"every input row ({unique:,}) was skipped: nothing was generated"
    if skipped / unique > max_share:
        return (f"{skipped:,} of {unique:,} input rows were skipped ({skipped / unique:.0%}, more than "
                f"[data] max_skipped_share {max_share:.0%})")
    return None


def failed_problem(totals: Totals, max_share: float) -> str | None:
    """Why the failed items fail the run (more than ``max_share`` of the unique items), else None."""
    failed, rows = totals.counts[Status.FAILED], sum(totals.counts.values())
    if not rows or not failed or failed / rows <= max_share:
        return None
    return (f"{failed:,} of {rows:,} items failed ({failed / rows:.0%}, more than [run] max_failed_share "
            f"{max_share:.0%})")


#: The table each output setting comes from, to name it as the job file spells it.
_SETTING_TABLES = {"model": "server", "engine": "server", "kv_cache_dtype": "server", "dtype": "server",
                   "extra_args": "server", "history": "run", "reasoning": "run", "truncated": "run",
                   "system_prompt": "data"}


def settings_diff(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The output settings that differ, as ``[sampling] max_tokens: 256 -> 64``, in a stable order."""
    out = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if isinstance(old, dict) or isinstance(new, dict):
            old, new = old or {}, new or {}
            out += [f"[{key}] {k}: {_shown(old.get(k))} -> {_shown(new.get(k))}"
                    for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        elif key == "truncated":
            out.append(f"[run] truncated, retry_max_tokens: {_shown(old)} -> {_shown(new)}")
        else:
            out.append(f"[{_SETTING_TABLES.get(key, 'server')}] {key}: {_shown(old)} -> {_shown(new)}")
    return out


def _shown(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value) if not isinstance(value, (int, float)) else str(value)


@dataclass(frozen=True)
class OtherJob:
    """A run folder that holds another job's ledger: who made it and what differs, each named."""

    run_dir: Path
    #: The job file that made it, when it was recorded.
    job_file: str | None
    #: ``[sampling] max_tokens: 256 -> 64``, ``[data] path: a.jsonl -> b.jsonl``, ...
    differences: tuple[str, ...]

    def refusal(self) -> str:
        """Why the folder cannot be continued by this job, and the two ways on."""
        made_by = f" (made by {self.job_file})" if self.job_file else ""
        return (f"{self.run_dir} belongs to another job{made_by}; this job differs in " + "; ".join(self.differences)
                + ". Give this job its own [output] dir, or --allow-mixed to continue that run with these settings")

    def taken(self, held: dict[str, int]) -> str:
        """What a folder that held no result did: it takes this job, having held ``held`` (items per status)."""
        items = ", ".join(f"{n:,} {status}" for status, n in held.items() if n) or "no items"
        return (f"{self.run_dir} held no results (an earlier attempt left {items}): it takes this job's settings "
                f"and starts afresh; it differed in " + "; ".join(self.differences))


def job_change(run_dir: Path, settings: dict[str, Any], data_path: str | None,
               fingerprint: str | None = None) -> OtherJob | None:
    """The run folder ``run_dir`` as another job's (its output ``settings`` differ, or its dataset
    is another file: another path with another ``fingerprint``, or the same path whose content
    changed; each named), or None when it holds no ledger or the same job (a dataset moved, same
    content, is the same job)."""
    if not (run_dir / LEDGER_FILE).is_file():
        return None
    try:
        ledger = Ledger.open_readonly(run_dir)
        try:
            meta = ledger.meta()
        finally:
            ledger.close()
    except LedgerError:
        return None  # Ledger.open says what is wrong with it
    differences = []
    before = meta.get("output_settings")
    if isinstance(before, dict) and meta.get("settings_hash") != hash_settings(settings):
        # The hash is of the values as given; the settings are stored and named as shown (a secret
        # as ***): two secrets that differ differ in the hash, and are named without their values.
        differences += settings_diff(redact_doc(before), redact_doc(settings)) or [
            "a value shown as *** (a secret: only the settings hash, made from the values as given, says it changed)"]
    old_path = ((meta.get("job") or {}).get("data") or {}).get("path")
    new_path = data_path
    known = meta.get("dataset_fingerprint")
    if old_path and new_path and Path(old_path).resolve() != Path(new_path).resolve() \
            and (fingerprint is None or known != fingerprint):
        differences.append(f"[data] path: {old_path} -> {new_path}")
    elif new_path and fingerprint is not None and known is not None and known != fingerprint:
        differences.append(f"[data] {new_path} changed since the run read it (its size, or its first or last MiB)")
    if not differences:
        return None
    return OtherJob(run_dir, str(meta["job_file"]) if meta.get("job_file") else None, tuple(differences))


def other_job(run_dir: Path, settings: dict[str, Any], data_path: str | None,
              fingerprint: str | None = None) -> str | None:
    """Why the run folder ``run_dir`` belongs to another job (:func:`job_change`), or None."""
    change = job_change(run_dir, settings, data_path, fingerprint)
    return change.refusal() if change is not None else None


__all__ = ["OtherJob", "job_change", "other_job", "resume_line", "settings_diff", "skipped_problem"]
