"""Ids without ``[data] id_field``: a row's own ``id`` field is its id, else the content hash.

Real JSON Lines files of each shape (prompt, OpenAI messages, ShareGPT from/value, SpecForge
role/content) go through ``iter_items`` as ``harvest run`` reads them.
"""

from __future__ import annotations

import json

import pytest

from harvest.config import DataConfig
from harvest.dataset import Item, Skipped, content_hash, iter_items

SHAPES = {
    "prompt": lambda text: {"prompt": text},
    "messages": lambda text: {"messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": text}]},
    "sharegpt": lambda text: {"conversations": [{"from": "human", "value": text},
                                                {"from": "gpt", "value": "old answer"}]},
    "specforge": lambda text: {"conversations": [{"role": "user", "content": text},
                                                 {"role": "assistant", "content": "old answer"}]},
}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_rows_own_id_is_the_item_id(tmp_path, shape):
    make = SHAPES[shape]
    rows = [{"id": f"row-{i}", **make(f"question {i}")} for i in range(3)] + [{"id": 17, **make("int id")}]
    items = list(iter_items(DataConfig(path=str(_write(tmp_path / "in.jsonl", rows)))))
    assert all(isinstance(i, Item) for i in items)
    assert [i.id for i in items] == ["row-0", "row-1", "row-2", "17"]
    assert [i.raw_id for i in items] == ["row-0", "row-1", "row-2", "17"]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rows_without_a_usable_id_keep_the_content_hash(tmp_path, shape):
    make = SHAPES[shape]
    rows = [make("no id"), {"id": None, **make("null id")}, {"id": "  ", **make("blank id")},
            {"id": {"nested": 1}, **make("object id")}, {"id": "skip:x", **make("reserved prefix")},
            {"id": True, **make("boolean id")}, {"id": "kept", **make("good id")}]
    items = list(iter_items(DataConfig(path=str(_write(tmp_path / "in.jsonl", rows)))))
    assert all(isinstance(i, Item) for i in items)  # an unusable id never skips a row
    hashed = items[:-1]
    assert [i.id for i in hashed] == [content_hash(i.messages) for i in hashed]
    assert items[-1].id == "kept"


def test_empty_id_field_always_uses_the_content_hash(tmp_path):
    rows = [{"id": "a", **SHAPES["sharegpt"]("one")}, {"id": "b", **SHAPES["sharegpt"]("two")}]
    items = list(iter_items(DataConfig(path=str(_write(tmp_path / "in.jsonl", rows)), id_field="")))
    assert [i.id for i in items] == [content_hash(i.messages) for i in items]
    assert [i.raw_id for i in items] == ["a", "b"]  # still known, not used as the id


def test_a_named_id_field_still_wins_and_is_required(tmp_path):
    rows = [{"id": "ignored", "key": "k1", "prompt": "x"}, {"id": "ignored2", "prompt": "y"}]
    out = list(iter_items(DataConfig(path=str(_write(tmp_path / "in.jsonl", rows)), id_field="key")))
    assert isinstance(out[0], Item) and out[0].id == "k1"
    assert isinstance(out[1], Skipped) and "missing id field 'key'" in out[1].reason
