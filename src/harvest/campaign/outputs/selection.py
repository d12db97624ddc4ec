"""Which items an export selects: statuses from names, a format's default, and what is said when
nothing is selected (what the run holds, and the fix in the command's or the API's words)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from harvest.errors import ConfigError, LedgerError
from harvest.ledger import Ledger, Status



class Selected(Protocol):
    """What :func:`nothing_selected` reads of an export's report."""

    @property
    def without_logprobs(self) -> int: ...

DEFAULT_STATUSES: tuple[Status, ...] = (Status.DONE,)
#: Statuses exported when none are named: ``done``, but a batch output file has a line for every
#: request that ended, answered or not (one line per input line once the run is complete).
FORMAT_DEFAULT_STATUSES: Mapping[str, tuple[Status, ...]] = {
    "openai-batch": (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED)}


def selected_statuses(fmt: str, values: str | Status | Iterable[str | Status] | None) -> tuple[Status, ...]:
    """The statuses an export of ``fmt`` writes: those named, else the format's default
    (:data:`FORMAT_DEFAULT_STATUSES`, else ``done``)."""
    named = parse_statuses(values) if values is not None else ()
    return named or FORMAT_DEFAULT_STATUSES.get(fmt, DEFAULT_STATUSES)


def parse_statuses(values: str | Status | Iterable[str | Status]) -> tuple[Status, ...]:
    """Statuses from names (comma-separated lists allowed; one string is one name or list, never
    its letters), in order, without repeats."""
    if isinstance(values, (str, Status)):
        values = (values,)
    out: list[Status] = []
    for value in values:
        for name in (value.value,) if isinstance(value, Status) else str(value).split(","):
            name = name.strip().lower()
            if not name:
                continue
            try:
                status = Status(name)
            except ValueError:
                known = ", ".join(s.value for s in Status)
                raise ConfigError("harvest export options", [
                    ("--status", f"unknown status {name!r} (one of {known})")]) from None
            if status not in out:
                out.append(status)
    return tuple(out)


def nothing_selected(run_dir: str | Path, fmt: str, statuses: Sequence[Status], report: Selected, *,
                     flags: bool = True) -> str:
    """Why an export wrote nothing, with what the run holds and the fix, in the command's words
    (``flags``: ``--status``, ``--allow-empty``) or the Python API's (``statuses=``, ``allow_empty=True``)."""
    if fmt == "logprobs" and report.without_logprobs:
        return (f"--format logprobs: none of the run's {report.without_logprobs:,} selected results carries "
                f"log-probabilities (they ran with [sampling] logprobs = 0): set [sampling] logprobs = K for a new "
                f"run, or export another format; no file written")
    other, empty = ("--status", "--allow-empty") if flags else ("statuses=", "allow_empty=True")
    return (f"--format {fmt}: no item of status {', '.join(s.value for s in statuses)} to export "
            f"({_what_is_there(run_dir)}): pick other statuses with {other}, or {empty} to write an empty file; "
            f"no file written")


def _what_is_there(run_dir: str | Path) -> str:
    """The run's items per status, e.g. ``the run holds skipped 20``."""
    try:
        ledger = Ledger.open_readonly(run_dir)
    except LedgerError:
        return "the run holds no readable ledger"
    try:
        counts = {s.value: n for s, n in ledger.counts().items() if n}
    finally:
        ledger.close()
    return "the run holds " + (", ".join(f"{s} {n:,}" for s, n in counts.items()) if counts else "no item")


__all__ = ["DEFAULT_STATUSES", "FORMAT_DEFAULT_STATUSES", "nothing_selected", "parse_statuses", "selected_statuses"]
