"""OpenAI batch input files read as items: each line one record, a bad line skipped with its line
and reason (another url, an unknown model, a malformed body, a repeated custom_id), the row's own
body kept on the item, and a resumed read the same sequence as a whole one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harvest.config import DataConfig
from harvest.dataset import Item, Skipped, is_batch_file, iter_items
from harvest.dataset.records import BatchRequest

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def line(cid: object, url: str = CHAT, method: str = "POST", **body: object) -> str:
    if "messages" not in body and "prompt" not in body:
        body = {("messages" if url == CHAT else "prompt"): [{"role": "user", "content": f"q {cid}"}]
                if url == CHAT else f"p {cid}", **body}
    return json.dumps({"custom_id": cid, "method": method, "url": url, "body": body})


#: (line text, None for an item / a piece of the skip reason)
ROWS: list[tuple[str, str | None]] = [
    (line("c1", model="served", max_tokens=5, temperature=0.5, n=2, logprobs=True, top_logprobs=2), None),
    (line("t1", TEXT, max_tokens=3, logprobs=1, seed=7, stop=["\n"]), None),
    (line("e1", "/v1/embeddings", input="x"), "url '/v1/embeddings' is not supported"),
    (line("m1", model="gpt-4o"), "body.model is not a model this job serves: set it to 'served'"),
    (line("b1", max_tokens="5"), "body.max_tokens: Input should be a valid integer"),
    (line("b2", tools=[{"type": "function"}]), "body.tools is not supported for /v1/chat/completions"),
    (line("b3", stream=True), "body.stream = true is not supported"),
    (line("b4", TEXT, prompt=[1, 2, 3]), "body.prompt: Input should be a valid string"),
    (line("b5", messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
     "ends with an assistant message"),
    (line("b6", method="GET"), "method 'GET' is not supported"),
    (line(17), "custom_id is int 17, expected non-empty text"),
    ('{"custom_id": "x", "body": ', "bad JSON"),
    (json.dumps({"custom_id": "n1", "url": CHAT, "body": None}), "body is null, expected an object"),
    (line("c1", max_tokens=9), "custom_id repeats an earlier line; custom_ids are unique in a batch file "
                               "(custom_id 'c1', first at line 1)"),
    (line("c2", max_completion_tokens=4, top_p=0.5), None),
    (line(""), "custom_id is str '', expected non-empty text"),
    (line("skip:mine"), "uses the prefix 'skip:', reserved for lines without a custom_id"),
    (json.dumps({"method": "POST", "url": CHAT, "body": {"messages": []}}), "not an OpenAI batch line"),
    (line("\ud800"), "not valid UTF-8"),
]


def own_id(text: str) -> str | None:
    """The custom_id a line gives, as its output line must echo it: text that is valid UTF-8, else None."""
    try:
        cid = json.loads(text).get("custom_id")
    except ValueError:
        return None
    return cid if isinstance(cid, str) and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in cid) else None


@pytest.fixture
def batch_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(text for text, _ in ROWS) + "\n")
    return path


def test_each_line_is_an_item_or_a_skip_naming_its_line_and_reason(batch_file):
    config = DataConfig(path=str(batch_file))
    assert is_batch_file(config)  # auto: the first record has custom_id and body
    records = list(iter_items(config, models={"served"}))
    assert len(records) == len(ROWS)  # nothing lost: one record per line, in file order
    for n, (record, (_, reason)) in enumerate(zip(records, ROWS), 1):
        if reason is None:
            assert isinstance(record, Item) and record.source_line == n
        else:
            assert isinstance(record, Skipped), (n, record)
            assert record.line == n and record.source == str(batch_file) and reason in record.reason, record
    c1, t1, c2 = (r for r in records if isinstance(r, Item))
    assert (c1.id, c1.raw_id) == ("c1", "c1")
    assert c1.request == BatchRequest(CHAT, (("logprobs", True), ("max_tokens", 5), ("n", 2), ("temperature", 0.5),
                                             ("top_logprobs", 2)))
    assert t1.request == BatchRequest(TEXT, (("logprobs", 1), ("max_tokens", 3), ("seed", 7), ("stop", ["\n"])),
                                      prompt="p t1")
    assert c2.request is not None and c2.request.overrides() == {"max_tokens": 4, "top_p": 0.5}
    # the skip reason names the row's custom_id where it has one, and the record keeps it as given
    assert "(custom_id 'e1')" in records[2].reason  # type: ignore[union-attr]
    assert [r.raw_id for r in records] == [own_id(text) for text, _ in ROWS]
    assert [r.raw_id for r in records[-4:]] == ["", "skip:mine", None, None]
    assert records[13].raw_id == "c1" and records[13].id == "skip:requests.jsonl:14"  # type: ignore[union-attr]


def test_the_request_is_part_of_the_stored_input(batch_file):
    item = next(r for r in iter_items(DataConfig(path=str(batch_file))) if isinstance(r, Item))
    again = Item.from_json(item.id, item.source, item.source_line, item.to_json())
    assert again == item and again.request is not None and again.request.get("n") == 2


@pytest.mark.parametrize("skip", [1, 5, 13, 14])
def test_a_resumed_read_yields_what_the_whole_read_yields_after_its_first_records(batch_file, skip):
    config = DataConfig(path=str(batch_file))
    whole = list(iter_items(config, models={"served"}))
    assert list(iter_items(config, skip, models={"served"})) == whole[skip:]  # the repeat of line 1 still found


def test_without_served_names_any_model_runs_and_limit_counts_lines(batch_file):
    records = list(iter_items(DataConfig(path=str(batch_file), limit=4)))
    assert len(records) == 4 and isinstance(records[3], Item)  # gpt-4o: no [server] to check it against


def test_a_prompt_file_is_not_a_batch_file_and_shape_names_it(tmp_path):
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert not is_batch_file(DataConfig(path=str(plain)))
    [row] = iter_items(DataConfig(path=str(plain), shape="openai-batch"))
    assert isinstance(row, Skipped) and "not an OpenAI batch line" in row.reason
