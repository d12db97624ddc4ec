"""dataset: read prompt datasets as a stream of normalized, validated conversations with stable ids.

Formats: JSON Lines, JSON arrays (streamed), CSV/TSV, Parquet and Hugging Face ``save_to_disk``
folders (the last two need the ``parquet`` extra). Shapes: a prompt field, OpenAI ``messages``,
ShareGPT ``conversations`` (from/value), SpecForge ``conversations`` (role/content) and OpenAI
batch input lines (``custom_id``, ``url``, ``body``: each item carries its own request). A bad row
becomes a ``Skipped`` record (source, line, reason) and the stream goes on.

This package never holds a whole dataset in memory and never dedupes (the ledger does; a batch
file's repeated custom_id is reported as a skipped row, dataset/batch.py).
"""

from __future__ import annotations

from harvest.dataset.arrow import read_arrow_file, read_hf, read_parquet
from harvest.dataset.batch import batch_item, is_batch_record
from harvest.dataset.items import EXTENSIONS, detect_format, is_batch_file, iter_items, read_rows, used_columns
from harvest.dataset.readers import MAX_RECORD_BYTES, read_csv, read_json, read_jsonl
from harvest.dataset.records import ASSISTANT, ROLES, SYSTEM, USER, BatchRequest, Item, Message, Role, Row, Skipped
from harvest.dataset.shapes import ROLE_ALIASES, SKIP_PREFIX, content_hash, normalize

__all__ = [
    "ASSISTANT",
    "BatchRequest",
    "EXTENSIONS",
    "Item",
    "MAX_RECORD_BYTES",
    "Message",
    "ROLES",
    "ROLE_ALIASES",
    "Role",
    "Row",
    "SKIP_PREFIX",
    "SYSTEM",
    "Skipped",
    "USER",
    "batch_item",
    "content_hash",
    "detect_format",
    "is_batch_file",
    "is_batch_record",
    "iter_items",
    "normalize",
    "read_arrow_file",
    "read_csv",
    "read_hf",
    "read_json",
    "read_jsonl",
    "read_parquet",
    "read_rows",
    "used_columns",
]
