"""Row normalization: every input shape, field mapping, validation reasons and stable ids."""

from __future__ import annotations

import hashlib

import pytest

from harvest.config import DataConfig
from harvest.dataset import Item, Message, Row, Skipped, content_hash, normalize


def cfg(**kw) -> DataConfig:
    return DataConfig(path="unused.jsonl", **kw)


def norm(data, **kw) -> Item | Skipped:
    return normalize(Row("data.jsonl", 7, data), cfg(**kw))


def test_prompt_shape_becomes_one_user_turn():
    item = norm({"prompt": "Why is the sky blue?"})
    assert isinstance(item, Item)
    assert item.messages == (Message("user", "Why is the sky blue?"),)
    assert item.source == "data.jsonl" and item.source_line == 7
    assert item.id == content_hash(item.messages) and len(item.id) == 32


def test_openai_messages_shape():
    item = norm({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "part 1"}, {"type": "text", "text": "part 2"}]},
    ]})
    assert isinstance(item, Item)
    assert [m.role for m in item.messages] == ["system", "user", "assistant", "user"]
    assert item.messages[3].content == "part 1\npart 2"
    assert item.system == "Be brief."


def test_sharegpt_shape_maps_from_value_roles():
    item = norm({"conversations": [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "Q1"},
        {"from": "gpt", "value": "A1"},
        {"from": "human", "value": "Q2"},
        {"from": "gpt", "value": "A2"},
    ]})
    assert isinstance(item, Item)
    assert [(m.role, m.content) for m in item.messages] == [
        ("system", "S"), ("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")]
    assert item.user_turns() == ("Q1", "Q2")
    assert item.assistant_turns() == ("A1", "A2")
    assert item.turns == 2


def test_specforge_shape_role_content_under_conversations():
    item = norm({"id": "sf-1", "conversations": [
        {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})
    assert isinstance(item, Item)
    assert [m.role for m in item.messages] == ["user", "assistant"]
    assert item.raw_id == "sf-1"
    assert item.id == "sf-1"  # the row's own "id" is its id without id_field (tests/dataset/test_own_ids.py)


def test_custom_field_names_and_explicit_shape():
    item = norm({"question": "Q?"}, prompt_field="question", shape="prompt")
    assert isinstance(item, Item) and item.user_turns() == ("Q?",)
    item = norm({"dialog": [{"from": "human", "value": "x"}]}, conversations_field="dialog", shape="sharegpt")
    assert isinstance(item, Item) and item.user_turns() == ("x",)


def test_conversation_given_as_json_text_is_decoded():
    item = norm({"messages": '[{"role": "user", "content": "from csv"}]'})
    assert isinstance(item, Item) and item.user_turns() == ("from csv",)


def test_config_system_prompt_is_added_only_when_row_has_none():
    item = norm({"prompt": "Q"}, system_prompt="You are terse.")
    assert isinstance(item, Item)
    assert item.messages == (Message("system", "You are terse."), Message("user", "Q"))
    own = norm({"messages": [{"role": "system", "content": "Mine"}, {"role": "user", "content": "Q"}]},
               system_prompt="You are terse.")
    assert isinstance(own, Item) and own.system == "Mine"


def test_system_prompt_changes_the_hash_id():
    a = norm({"prompt": "Q"})
    b = norm({"prompt": "Q"}, system_prompt="S")
    assert isinstance(a, Item) and isinstance(b, Item)
    assert a.id != b.id


def test_user_id_field_is_stringified():
    item = norm({"uid": 42, "prompt": "Q"}, id_field="uid")
    assert isinstance(item, Item) and item.id == "42" and item.raw_id == "42"


@pytest.mark.parametrize(
    ("data", "kw", "reason_part"),
    [
        ({}, {}, "no 'prompt', 'messages' or 'conversations' field"),
        ({"prompt": 3}, {}, "'prompt' is int, expected text"),
        ({"prompt": "   "}, {}, "'prompt' is empty"),
        ({"messages": []}, {}, "empty conversation"),
        ({"messages": {"role": "user"}}, {}, "expected a list of messages"),
        ({"messages": "not json ["}, {}, "not a JSON list"),
        ({"messages": [{"role": "user", "content": 5}]}, {}, "content is int"),
        ({"messages": [{"role": "user"}]}, {}, "no 'content'"),
        ({"messages": [{"content": "x"}]}, {}, "neither 'role' nor 'from'"),
        ({"messages": [{"role": "tool", "content": "x"}]}, {}, "role 'tool' is not supported"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, {}, "starts with assistant"),
        ({"messages": [{"role": "system", "content": "x"}]}, {}, "only system messages"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, {},
         "messages[1]: user follows user"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}, {},
         "system message after"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, {},
         "'image_url' is not text"),
        ({"messages": [{"role": "user", "content": "\ud800 lone"}]}, {}, "not valid UTF-8"),
        ({"prompt": "Q"}, {"id_field": "uid"}, "missing id field 'uid'"),
        ({"prompt": "Q", "uid": 1.5}, {"id_field": "uid"}, "expected text or an integer"),
        ({"prompt": "Q", "uid": True}, {"id_field": "uid"}, "expected text or an integer"),
        ({"prompt": "Q", "uid": " "}, {"id_field": "uid"}, "is empty"),
        ({"prompt": "Q", "uid": "skip:x"}, {"id_field": "uid"}, "reserved"),
    ],
)
def test_bad_rows_are_skipped_with_reason(data, kw, reason_part):
    out = norm(data, **kw)
    assert isinstance(out, Skipped), out
    assert out.source == "data.jsonl" and out.line == 7
    assert reason_part in out.reason
    assert out.id == "skip:data.jsonl:7"


def test_trailing_assistant_is_kept_as_original_answer():
    item = norm({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "old"}]})
    assert isinstance(item, Item)
    assert item.turns == 1 and item.assistant_turns() == ("old",)


def test_hash_id_is_stable_and_content_sensitive():
    a1 = norm({"prompt": "same"})
    a2 = normalize(Row("other-file.jsonl", 99, {"prompt": "same"}), cfg())
    b = norm({"prompt": "same!"})
    assert isinstance(a1, Item) and isinstance(a2, Item) and isinstance(b, Item)
    assert a1.id == a2.id != b.id
    # The canonical form is pinned: if it drifted between harvest versions, resumes would redo work.
    assert a1.id == hashlib.blake2b(b'[["user","same"]]', digest_size=16).hexdigest()
