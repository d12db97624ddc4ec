"""Item helpers the runner uses for multi-turn regeneration, and the stored JSON round trip."""

from __future__ import annotations

import pytest

from harvest.dataset import Item, Message, Skipped


def conversation() -> Item:
    return Item(
        id="x",
        source="d.jsonl",
        source_line=3,
        messages=(
            Message("system", "S"),
            Message("user", "Q1"),
            Message("assistant", "A1"),
            Message("user", "Q2"),
            Message("assistant", "A2"),
            Message("user", "Q3"),
        ),
        raw_id="r",
    )


def test_turns_and_originals():
    item = conversation()
    assert item.turns == 3
    assert item.user_turns() == ("Q1", "Q2", "Q3")
    assert item.assistant_turns() == ("A1", "A2")
    assert item.system == "S"


def test_history_uses_regenerated_replies():
    item = conversation()
    h = item.history(2, replies=["N1", "N2"])
    assert [(m.role, m.content) for m in h] == [
        ("system", "S"), ("user", "Q1"), ("assistant", "N1"), ("user", "Q2"), ("assistant", "N2"),
        ("user", "Q3")]
    assert [m.content for m in item.history(0, replies=[])] == ["S", "Q1"]


def test_history_with_original_turns_as_context():
    item = conversation()
    assert [m.content for m in item.history(1)] == ["S", "Q1", "A1", "Q2"]


def test_history_rejects_missing_turns_and_replies():
    item = conversation()
    with pytest.raises(IndexError):
        item.history(3)
    with pytest.raises(ValueError):
        item.history(2, replies=["only one"])


def test_json_round_trip_keeps_everything():
    item = conversation()
    back = Item.from_json(item.id, item.source, item.source_line, item.to_json())
    assert back == item


def test_skipped_id_uses_file_name_only():
    assert Skipped("some/where/data.jsonl", 12, "bad").id == "skip:data.jsonl:12"
    assert Skipped("data.jsonl", 12, "bad").id == Skipped("moved/data.jsonl", 12, "other").id
