"""``iter_items(config, skip=n)`` is ``iter_items(config)`` without its first n records, for
every format: what lets a resumed ingest pass over what it committed without normalizing it."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harvest.config import DataConfig
from harvest.dataset import iter_items
from harvest.dataset.records import Skipped


def _rows():
    rows = [{"id": f"r{i}", "prompt": f"Prompt {i}."} for i in range(40)]
    rows[7] = {"id": "r7", "prompt": ""}  # skipped by normalize (empty prompt)
    rows[12] = {"id": "r3", "prompt": "Prompt 3."}  # a duplicate id
    return rows


def _write(tmp_path, fmt):
    rows = _rows()
    if fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        lines = [json.dumps(r) for r in rows]
        lines.insert(5, "")  # blank lines are not records
        lines.insert(9, "{not json")  # a bad record: a Skipped one
        lines.insert(20, "   ")
        path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\n")
    elif fmt == "json":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(rows[:9] + [17] + rows[9:], indent=1))
    elif fmt == "csv":
        path = tmp_path / "d.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["id", "prompt"])
            w.writeheader()
            w.writerows(rows)
    else:
        path = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    return DataConfig(path=str(path), id_field="id")


def _key(rec):
    return ("skip", rec.source, rec.line, rec.reason) if isinstance(rec, Skipped) else ("item", rec.to_json(),
                                                                                    rec.source_line)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_skip_yields_the_same_tail(tmp_path, fmt):
    cfg = _write(tmp_path, fmt)
    whole = [_key(r) for r in iter_items(cfg)]
    assert len(whole) >= 40 and any(k[0] == "skip" for k in whole)
    for n in (0, 1, 5, 9, 10, 21, len(whole) - 1, len(whole), len(whole) + 3):
        assert [_key(r) for r in iter_items(cfg, skip=n)] == whole[n:], n


def test_skip_counts_towards_the_limit(tmp_path):
    cfg = _write(tmp_path, "jsonl").model_copy(update={"limit": 12})
    whole = [_key(r) for r in iter_items(cfg)]
    assert len(whole) == 12
    assert [_key(r) for r in iter_items(cfg, skip=5)] == whole[5:]
    assert list(iter_items(cfg, skip=12)) == [] and list(iter_items(cfg, skip=30)) == []
