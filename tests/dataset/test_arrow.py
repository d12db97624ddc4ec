"""Parquet files and Hugging Face save_to_disk folders, written here with pyarrow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.realparts import require

require("pyarrow", "Arrow and Parquet inputs are read with pyarrow")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from harvest.config import DataConfig  # noqa: E402
from harvest.dataset import Item, Row, Skipped, iter_items, read_hf, read_parquet  # noqa: E402
from harvest.errors import ConfigError  # noqa: E402

CONVERSATION = pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))


def sharegpt_table(n: int, start: int = 0) -> pa.Table:
    ids = [f"row-{i}" for i in range(start, start + n)]
    convs = [[{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}]
             for i in range(start, start + n)]
    return pa.table({"id": ids, "conversations": pa.array(convs, type=CONVERSATION),
                     "unused": list(range(n))})


def string_array_with_bad_utf8() -> pa.Array:
    """A string column whose second value is not UTF-8 (Arrow does not validate on construction)."""
    offsets = pa.py_buffer(pa.array([0, 4, 6, 10], type=pa.int32()).buffers()[1])
    data = pa.py_buffer(b"good\xff\xfelast")
    return pa.Array.from_buffers(pa.string(), 3, [None, offsets, data])


def write_save_to_disk(folder: Path, tables: list[pa.Table]) -> Path:
    """What ``datasets.Dataset.save_to_disk`` writes: Arrow *stream* shards, state.json, dataset_info.json."""
    folder.mkdir(parents=True)
    names = [f"data-{i:05d}-of-{len(tables):05d}.arrow" for i in range(len(tables))]
    features = {"id": {"dtype": "string", "_type": "Value"},
                "conversations": [{"from": {"dtype": "string", "_type": "Value"},
                                   "value": {"dtype": "string", "_type": "Value"}}],
                "unused": {"dtype": "int64", "_type": "Value"}}
    for name, table in zip(names, tables):
        schema = table.schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for batch in table.cast(schema).to_batches(max_chunksize=7):
                writer.write_batch(batch)
    (folder / "dataset_info.json").write_text(json.dumps(
        {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}, indent=2))
    (folder / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names],
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }, indent=2, sort_keys=True))
    return folder


def test_parquet_rows_stream_by_batch_with_row_numbers(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(sharegpt_table(50), p, row_group_size=16)
    rows = list(read_parquet(p, batch_rows=8))
    assert [r.line for r in rows] == list(range(1, 51))
    first_turn = rows[10].data["conversations"][0]  # type: ignore[union-attr]
    assert first_turn == {"from": "human", "value": "question 10"}


def test_parquet_items_with_id_field_only_read_needed_columns(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(sharegpt_table(3), p)
    items = list(iter_items(DataConfig(path=str(p), id_field="id")))
    assert [i.id for i in items] == ["row-0", "row-1", "row-2"]  # type: ignore[union-attr]
    assert items[2].assistant_turns() == ("answer 2",)  # type: ignore[union-attr]
    narrow = list(read_parquet(p, columns={"id", "conversations"}))
    assert all(set(r.data) == {"id", "conversations"} for r in narrow)  # type: ignore[union-attr]


def test_parquet_bad_values_are_skipped_alone(tmp_path):
    p = tmp_path / "d.parquet"
    table = pa.table({"prompt": string_array_with_bad_utf8(), "id": ["a", "b", "c"]})
    pq.write_table(table, p)
    out = list(iter_items(DataConfig(path=str(p), id_field="id")))
    assert [type(r) for r in out] == [Item, Skipped, Item]
    assert out[1].line == 2 and "cannot be converted" in out[1].reason  # type: ignore[union-attr]


def test_parquet_mistyped_and_missing_fields_are_skipped(tmp_path):
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["fine", None, ""], "n": [1, 2, 3]}), p)
    out = list(iter_items(DataConfig(path=str(p))))
    assert isinstance(out[0], Item)
    assert isinstance(out[1], Skipped) and "'prompt' is null" in out[1].reason
    assert isinstance(out[2], Skipped) and "'prompt' is empty" in out[2].reason


def test_hf_save_to_disk_folder_reads_every_shard_in_order(tmp_path):
    folder = write_save_to_disk(tmp_path / "ds", [sharegpt_table(20), sharegpt_table(15, start=20)])
    out = list(iter_items(DataConfig(path=str(folder), id_field="id")))
    assert [i.id for i in out] == [f"row-{i}" for i in range(35)]  # type: ignore[union-attr]
    second_shard = out[20]
    assert isinstance(second_shard, Item) and second_shard.source_line == 1
    assert second_shard.source.endswith("data-00001-of-00002.arrow")


def test_hf_dataset_dict_with_one_split_and_with_several(tmp_path):
    root = tmp_path / "dd"
    write_save_to_disk(root / "train", [sharegpt_table(4)])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    assert len(list(read_hf(root))) == 4
    write_save_to_disk(root / "test", [sharegpt_table(2)])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(ConfigError, match="splits"):
        list(read_hf(root))
    assert len(list(read_hf(root / "test"))) == 2


def test_hf_arrow_file_format_is_read_too(tmp_path):
    p = tmp_path / "single.arrow"
    table = sharegpt_table(5)
    with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    rows = list(read_hf(p))
    assert len(rows) == 5 and all(isinstance(r, Row) for r in rows)


def test_hf_state_naming_a_missing_file_is_a_config_error(tmp_path):
    folder = write_save_to_disk(tmp_path / "ds", [sharegpt_table(2)])
    (folder / "data-00000-of-00001.arrow").unlink()
    with pytest.raises(ConfigError, match="missing"):
        list(read_hf(folder))
