"""Records the ledger takes and gives: item statuses, claimed work, results to commit, reports.

These are plain frozen values; nothing here touches the database. ``hash_settings`` gives the
canonical hash the runner stamps on a run (what the ledger compares on resume).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from harvest.dataset.records import Item
from harvest.words import counted


#: An item row's key: its id and sample index (``[sampling] n`` rows per input). A bare id means
#: sample 0 (every ledger call that takes keys accepts both).
Key = tuple[str, int]


def as_key(key: str | Key) -> Key:
    """``(id, sample)`` for a key or a bare id (sample 0)."""
    return (key, 0) if isinstance(key, str) else (key[0], int(key[1]))


class Status(str, Enum):
    """Where one item row (one sample of one input) of a run stands. Every unique input id has
    exactly one status per sample."""

    #: Waiting to be generated (new, released after a sick-server pause, or recovered after a crash).
    PENDING = "pending"
    #: Claimed by a runner and in flight. A row left "running" by a crash goes back to pending on open.
    RUNNING = "running"
    #: Generated; its result is committed (exactly once) in ``results``.
    DONE = "done"
    #: Generated but cut by the token limit (``finish_reason=length``) and kept as such; has a result.
    TRUNCATED = "truncated"
    #: The server rejected the item for a reason that belongs to the item (4xx after retries).
    FAILED = "failed"
    #: The input row is unusable (bad JSON, missing field, ...), or its prompt cannot fit the
    #: model's context (never sent); ``last_error`` says why.
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


#: Statuses that end an item's life in a run (``check_totals`` expects only these at the end).
FINAL_STATUSES: tuple[Status, ...] = (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED)
#: Statuses an engine's answer set: a result (done, truncated) or the item's own rejection (failed).
#: A ledger without any is a run that produced nothing, which a job of other settings may take over.
PRODUCED_STATUSES: tuple[Status, ...] = (Status.DONE, Status.TRUNCATED, Status.FAILED)
#: Statuses that come with a row in ``results``.
RESULT_STATUSES: tuple[Status, ...] = (Status.DONE, Status.TRUNCATED)


def hash_settings(settings: Mapping[str, Any]) -> str:
    """Canonical hash (BLAKE2b-128, 32 hex digits) of output-affecting settings (JSON-able values)."""
    canonical = json.dumps(settings, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=16).hexdigest()


@dataclass(frozen=True)
class ItemRow:
    """One claimed item: what the runner generates from. ``attempts`` counts charged attempts."""

    id: str
    attempts: int
    item: Item
    #: Which of the input's ``[sampling] n`` samples this row is (0 when n = 1).
    sample: int = 0

    @property
    def key(self) -> Key:
        return (self.id, self.sample)


@dataclass(frozen=True)
class Completion:
    """A generated result to commit. ``output`` is any JSON-able value (e.g. the regenerated turns)."""

    item_id: str
    output: Any
    status: Status = Status.DONE
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    sample: int = 0
    #: The sample's token log-probabilities, one encoded record (ledger/logprobs.py), or None.
    logprobs: bytes | None = None

    def __post_init__(self) -> None:
        if self.status not in RESULT_STATUSES:
            raise ValueError(f"a completion's status is done or truncated, not {self.status}")


@dataclass(frozen=True)
class Failure:
    """An item that failed for its own reason; ``error_class`` is a short stable name (e.g. ``http_400``)."""

    item_id: str
    error: str
    error_class: str
    sample: int = 0


@dataclass(frozen=True)
class ResultRow:
    """One item as exported: its status and input, with its result when it has one."""

    item_id: str
    status: Status
    attempts: int
    source: str | None
    source_line: int | None
    #: The normalized input; None for skipped rows (their input was unusable).
    item: Item | None
    dup_count: int
    last_error: str | None
    error_class: str | None
    output: Any = None
    settings_hash: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    created_at: float | None = None
    sample: int = 0
    #: Where the result's logprob record lies: ``(shard, offset, bytes)``, or None.
    logprobs_at: tuple[int, int, int] | None = None
    #: A row skipped at ingest: its own id where it had one (an OpenAI batch line's ``custom_id``);
    #: None for every other row (an item's own id is ``item.raw_id``) and for rows a schema 3
    #: ledger skipped.
    raw_id: str | None = None

    @property
    def join_id(self) -> str:
        """The id a user joins this row's output to its input by (a batch output's ``custom_id``):
        the item id; for a row skipped at ingest the id the row gave, where it had one, else the
        ledger's ``skip:<file>:<line>``."""
        return self.raw_id if self.item is None and self.raw_id is not None else self.item_id


@dataclass(frozen=True)
class IngestReport:
    """What an ``ingest`` call did, and the totals of the run's input so far."""

    #: Records consumed from the iterable by this call (after skipping those ingested before a crash).
    rows_read: int
    #: Records skipped at the start because an interrupted earlier ingest had already committed them.
    resumed_from: int
    #: Totals over the whole input (this call and earlier ones).
    total_rows: int
    unique: int
    duplicates: int
    skipped: int
    #: True once the iterable has been read to its end.
    complete: bool
    #: Items this call added (not duplicates), and how many of those are skipped rows.
    new_items: int = 0
    new_skipped: int = 0
    #: Input records (over the whole input) known by the user's own id rather than a content hash.
    own_ids: int = 0


@dataclass(frozen=True)
class ApplyReport:
    """What one batch of writer operations changed."""

    committed: int = 0
    #: Completions ignored because the item already had a result (or is not claimable).
    ignored: int = 0
    failed: int = 0
    released: int = 0
    charged: int = 0
    #: Items marked skipped at dispatch (never sent).
    skipped: int = 0


@dataclass(frozen=True)
class Totals:
    """The end-of-run check: every unique input item must end in a final status."""

    input_rows: int
    unique: int
    duplicates: int
    counts: Mapping[Status, int]
    results: int
    ingest_complete: bool
    problems: tuple[str, ...] = field(default=())
    #: Duplicate rows whose content differs from the first row with their id (that one is kept).
    id_conflicts: int = 0
    #: Rows per unique input (``[sampling] n``): final statuses must add up to ``unique * samples``.
    samples: int = 1

    @property
    def ok(self) -> bool:
        """True when done + truncated + failed + skipped == unique input x samples, and results match."""
        return not self.problems

    def describe(self) -> str:
        c = self.counts
        final = sum(c[s] for s in FINAL_STATUSES)
        line = (
            f"done {c[Status.DONE]} + truncated {c[Status.TRUNCATED]} + failed {c[Status.FAILED]}"
            f" + skipped {c[Status.SKIPPED]} = {final} of {self.unique} unique input items"
            + (f" x {self.samples} samples = {self.unique * self.samples}" if self.samples > 1 else "")
            + f" ({counted(self.input_rows, 'row')}, {counted(self.duplicates, 'duplicate')}"
            + (f", {self.id_conflicts} of them an id conflict: same id, different content" if self.id_conflicts
               else "") + ")"
        )
        return line if self.ok else line + "; " + "; ".join(self.problems)


__all__ = [
    "ApplyReport",
    "Completion",
    "FINAL_STATUSES",
    "Failure",
    "IngestReport",
    "ItemRow",
    "Key",
    "RESULT_STATUSES",
    "ResultRow",
    "Status",
    "Totals",
    "as_key",
    "hash_settings",
]
