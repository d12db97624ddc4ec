"""The token log-probabilities of a run as Parquet: one row per sample and assistant turn.

    id            string   the item's id
    sample        int32    which of its ``[sampling] n`` samples
    turn          int32    which assistant turn (0 for single-turn items)
    status        string   done / truncated
    token_ids     list<int32>           the generated tokens
    logprobs      list<float16>         their log-probabilities
    top_ids       list<list<int32>>     the top-k candidates of each token (-1: the engine sent fewer)
    top_logprobs  list<list<float16>>   their log-probabilities (-inf where it sent fewer)

Rows come in input order (item, then sample, then turn), read from the ledger and its shards
(ledger/logprobs.py); the file is written beside, fsynced and renamed into place like every export.
Zstd-compressed; float16 stays float16 (Parquet FLOAT16 logical type, pyarrow >= 15).
"""

from __future__ import annotations

from collections import Counter

from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from harvest.errors import ConfigError
from harvest.ledger import Ledger, ResultRow

#: Sample-turn rows per Parquet row group.
ROWS_PER_GROUP = 2048


#: How to get pyarrow from a clone of harvest (the ``parquet`` extra).
PYARROW_FIX = "install the parquet extra into harvest's environment (pip install -e '.[parquet]' in the clone)"


def pyarrow_for(fmt: str) -> tuple[Any, Any]:
    """pyarrow and pyarrow.parquet for ``--format fmt``, or a ConfigError naming the format and the fix."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"harvest export --format {fmt}", [(
            "pyarrow", f"is not installed: --format {fmt} writes Parquet; {PYARROW_FIX}"
                       + (", or export JSONL (--format specforge|sharegpt|openai-batch)" if fmt == "parquet" else "")
        )]) from None
    return pa, pq


def logprobs_schema(pa: Any) -> Any:
    return pa.schema([
        ("id", pa.string()), ("sample", pa.int32()), ("turn", pa.int32()), ("status", pa.string()),
        ("token_ids", pa.list_(pa.int32())), ("logprobs", pa.list_(pa.float16())),
        ("top_ids", pa.list_(pa.list_(pa.int32()))), ("top_logprobs", pa.list_(pa.list_(pa.float16()))),
    ])


def _column(pa: Any, arrays: list[np.ndarray], typ: Any) -> Any:
    """A list<T> column from one numpy array per row, without a Python object per token."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=typ.to_pandas_dtype())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=typ))


def _nested(pa: Any, arrays: list[np.ndarray], typ: Any) -> Any:
    """A list<list<T>> column from one (n, k) numpy array per row."""
    inner_lens = [np.full(a.shape[0], a.shape[1], dtype=np.int32) for a in arrays]
    inner = _column(pa, [a.reshape(-1) for a in arrays], typ).flatten()
    inner_offsets = np.zeros(sum(len(x) for x in inner_lens) + 1, dtype=np.int32)
    if inner_lens:
        np.cumsum(np.concatenate(inner_lens), out=inner_offsets[1:])
    lists = pa.ListArray.from_arrays(pa.array(inner_offsets), inner)
    outer = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([a.shape[0] for a in arrays], out=outer[1:])
    return pa.ListArray.from_arrays(pa.array(outer), lists)


def write_logprobs(ledger: Ledger, rows: Iterable[ResultRow], path: Path | BinaryIO,
                   by_status: Counter[str] | None = None) -> tuple[int, int]:
    """Write the logprobs of ``rows`` to ``path``. Returns (sample-turn rows written, results without
    logprobs passed over); ``by_status`` counts the results written, per status."""
    pa, pq = pyarrow_for("logprobs")
    schema = logprobs_schema(pa)
    written = without = 0
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}

    def flush(writer: Any) -> None:
        if not cols["id"]:
            return
        table = pa.Table.from_arrays([
            pa.array(cols["id"], pa.string()), pa.array(cols["sample"], pa.int32()),
            pa.array(cols["turn"], pa.int32()), pa.array(cols["status"], pa.string()),
            _column(pa, cols["token_ids"], pa.int32()), _column(pa, cols["logprobs"], pa.float16()),
            _nested(pa, cols["top_ids"], pa.int32()), _nested(pa, cols["top_logprobs"], pa.float16()),
        ], schema=schema)
        writer.write_table(table)
        for v in cols.values():
            v.clear()

    with pq.ParquetWriter(path if not isinstance(path, Path) else str(path), schema, compression="zstd") as writer:
        for row in rows:
            turns = ledger.logprobs(row)
            if turns is None:
                without += 1
                continue
            if by_status is not None:
                by_status[row.status.value] += 1
            for t, turn in enumerate(turns):
                cols["id"].append(row.item_id)
                cols["sample"].append(row.sample)
                cols["turn"].append(t)
                cols["status"].append(row.status.value)
                cols["token_ids"].append(turn.token_ids)
                cols["logprobs"].append(turn.logprobs)
                cols["top_ids"].append(turn.top_ids)
                cols["top_logprobs"].append(turn.top_logprobs)
                written += 1
            if len(cols["id"]) >= ROWS_PER_GROUP:
                flush(writer)
        flush(writer)
    return written, without


__all__ = ["PYARROW_FIX", "ROWS_PER_GROUP", "logprobs_schema", "pyarrow_for", "write_logprobs"]
