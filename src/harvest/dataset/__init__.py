"""dataset: read prompt datasets as a stream of normalized, validated conversations with stable ids.

Formats: JSON Lines, JSON arrays (streamed), CSV/TSV, Parquet and Hugging Face ``save_to_disk``
folders (the last two need the ``parquet`` extra). Shapes: a prompt field, OpenAI ``messages``,
ShareGPT ``conversations`` (from/value) and SpecForge ``conversations`` (role/content). A bad row
becomes a ``Skipped`` record (source, line, reason) and the stream goes on.

This package never holds a whole dataset in memory and never dedupes (the ledger does).
"""

from __future__ import annotations

from harvest.dataset.arrow import read_arrow_file, read_hf, read_parquet
from harvest.dataset.items import EXTENSIONS, detect_format, iter_items, read_rows, used_columns
from harvest.dataset.readers import MAX_RECORD_BYTES, read_csv, read_json, read_jsonl
from harvest.dataset.records import ASSISTANT, ROLES, SYSTEM, USER, Item, Message, Role, Row, Skipped
from harvest.dataset.shapes import ROLE_ALIASES, SKIP_PREFIX, content_hash, normalize

__all__ = [
    "ASSISTANT",
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
    "content_hash",
    "detect_format",
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
