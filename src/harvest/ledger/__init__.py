"""ledger: a run's job state in one SQLite file (WAL) in the run folder.

One row per unique input item (status, attempts, last error, source line, normalized input), at
most one result per item (exactly once, stamped with the settings hash), and the run's metadata.
``Ledger`` is the synchronous store; ``LedgerWriter`` batches the runner's writes from many asyncio
tasks onto one thread.

This package never generates, retries or judges servers; it records what the runner decided.
"""

from __future__ import annotations

from harvest.ledger.records import (
    FINAL_STATUSES,
    RESULT_STATUSES,
    ApplyReport,
    Completion,
    Failure,
    IngestReport,
    ItemRow,
    ResultRow,
    Status,
    Totals,
    hash_settings,
)
from harvest.ledger.schema import LEDGER_FILE, LOCK_FILE, SCHEMA_VERSION
from harvest.ledger.store import RESERVED_META, IngestBatch, Ledger, prepare_ingest
from harvest.ledger.writer import LedgerWriter

__all__ = [
    "ApplyReport",
    "Completion",
    "FINAL_STATUSES",
    "Failure",
    "IngestBatch",
    "IngestReport",
    "ItemRow",
    "LEDGER_FILE",
    "LOCK_FILE",
    "Ledger",
    "LedgerWriter",
    "RESERVED_META",
    "RESULT_STATUSES",
    "ResultRow",
    "SCHEMA_VERSION",
    "Status",
    "Totals",
    "hash_settings",
    "prepare_ingest",
]
