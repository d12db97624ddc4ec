"""`export_run` on real ledgers: every format read back, ids unique, roles alternating, reasoning kept
apart from content, the status filter, failed items as batch errors, atomic writes, flat memory.

The ledgers are built with the ledger API (ingest, claim, complete, fail) and results in the
documented result schema (docs/result-schema.md), as the runner stores them. ``build_run`` is
shared with the status and CLI tests.
"""

from __future__ import annotations

import json
import re
import sys
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harvest.campaign.outputs.export import (
    check_export,
    conversation_problems,
    default_output,
    export_run,
    split_think,
)
from harvest.dataset import Item, Message, Skipped
from harvest.errors import ConfigError, LedgerError
from harvest.ledger import Completion, Ledger, Status
from tests.campaign.specforge_rules import SpecForgeRejects, check_file
from tests.gpu.schema_doc import problems
from tests.realparts import require

SETTINGS = "0" * 32
DOC = Path(__file__).resolve().parents[2] / "docs" / "result-schema.md"


def documented(schema_id: str) -> dict[str, Any]:
    """The ```json block of docs/result-schema.md whose ``$id`` is ``schema_id``."""
    for block in re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S):
        schema = json.loads(block)
        if schema.get("$id") == schema_id:
            return schema
    raise AssertionError(f"{DOC} documents no schema with $id {schema_id!r}")


def item(item_id: str, line: int, *turns: tuple[str, str]) -> Item:
    messages = tuple(Message(r, c) for r, c in turns)  # type: ignore[arg-type]
    return Item(item_id, "data.jsonl", line, messages, raw_id=item_id)


def output(it: Item, answers: Sequence[str], *, reasoning: Sequence[str | None] | None = None,
           finish: str = "stop") -> dict[str, Any]:
    """A result as the runner stores it: system + user turns with each assistant turn regenerated."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": m.content} for m in it.messages
                                      if m.role == "system"]
    turns = []
    for k, user in enumerate(it.user_turns()):
        messages.append({"role": "user", "content": user})
        reply: dict[str, Any] = {"role": "assistant", "content": answers[k]}
        if reasoning is not None and reasoning[k] is not None:
            reply["reasoning_content"] = reasoning[k]
        messages.append(reply)
        last = k == it.turns - 1
        turns.append({"finish_reason": finish if last else "stop", "prompt_tokens": 10 + k,
                      "completion_tokens": 5 + k, "endpoint": "http://127.0.0.1:8000/v1", "latency_s": 0.25,
                      "attempts": 1})
    return {"messages": messages, "turns": turns, "model": "tiny-llama", "settings_hash": SETTINGS}


MULTI = item("multi", 3, ("system", "be brief"), ("user", "hi"), ("assistant", "old 1"), ("user", "and?"),
             ("assistant", "old 2"))


def build_run(run_dir: Path, *, finished: bool = True, extra_done: int = 3) -> dict[str, list[str]]:
    """A run with every status: done (plain, reasoning with a leftover <think> block, multi-turn),
    truncated, failed (two classes), skipped, a duplicate row; unless ``finished``, two pending items
    and one running. Returns the item ids per status, in input order."""
    plain = item("plain", 1, ("user", "say hello"))
    think = item("think", 2, ("system", "reason first"), ("user", "2+2?"))
    trunc = item("trunc", 4, ("user", "write a long story"))
    bad = item("bad400", 5, ("user", "x" * 50))
    bad2 = item("bad422", 6, ("user", "??"))
    extras = [item(f"extra{i}", 9 + i, ("user", f"question {i}")) for i in range(extra_done)]
    waiting = [item(f"wait{i}", 20 + i, ("user", f"later {i}")) for i in range(3)]
    records: list[Item | Skipped] = [plain, think, MULTI, trunc, bad, bad2,
                                     Skipped("data.jsonl", 7, "bad JSON: x"),
                                     item("plain", 8, ("user", "say hello")), *extras]
    if not finished:
        records += waiting
    ids: dict[str, list[str]] = {s.value: [] for s in Status}
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest(records)
        claimed = {r.id for r in ledger.claim(100)}
        assert claimed >= {"plain", "think", "multi", "trunc", "bad400", "bad422"}
        ledger.complete([
            Completion("plain", output(plain, ["hello"]), finish_reason="stop", prompt_tokens=10,
                       completion_tokens=5),
            Completion("think", output(think, ["<think>2 and 2</think>\n\nIt is 4."],
                                       reasoning=["2 and 2 make 4"]),
                       finish_reason="stop", prompt_tokens=10, completion_tokens=5),
            Completion("multi", output(MULTI, ["hello!", "that's all"], reasoning=["greet", None]),
                       finish_reason="stop", prompt_tokens=21, completion_tokens=11),
            Completion("trunc", output(trunc, ["once upon a"], finish="length"), status=Status.TRUNCATED,
                       finish_reason="length", prompt_tokens=10, completion_tokens=5),
            *[Completion(e.id, output(e, [f"answer {i}"]), finish_reason="stop", prompt_tokens=10,
                         completion_tokens=5) for i, e in enumerate(extras)],
        ])
        assert ledger.fail("bad400", "HTTP 400: prompt is too long for the context", "http_400")
        assert ledger.fail("bad422", "HTTP 422: unprocessable", "http_422")
        if not finished:
            assert ledger.release(["wait0", "wait1"]) == 2  # wait2 stays running
    ids["done"] = ["plain", "think", "multi", *[e.id for e in extras]]
    ids["truncated"] = ["trunc"]
    ids["failed"] = ["bad400", "bad422"]
    ids["skipped"] = ["skip:data.jsonl:7"]
    if not finished:
        ids["pending"] = ["wait0", "wait1"]
        ids["running"] = ["wait2"]
    return ids


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    run_dir = tmp_path / "run"
    return run_dir, build_run(run_dir)


# ------------------------------------------------------------------------------------ formats


def test_specforge_holds_done_items_with_whole_regenerated_conversations(run):
    run_dir, ids = run
    report = export_run(run_dir, "specforge")
    assert report.path == run_dir / "export.specforge.jsonl" == default_output(run_dir, "specforge")
    assert (report.written, dict(report.by_status), report.malformed) == (len(ids["done"]), {"done": 6}, 0)
    lines = read_jsonl(report.path)
    assert [r["id"] for r in lines] == ids["done"]  # input order, the duplicate row exported once
    schema = documented("harvest.export.specforge/1")
    assert all(problems(r, schema) == [] for r in lines)
    assert all(r["status"] == "success" and "truncated" not in r for r in lines)
    assert check_export(report.path, "specforge").ok
    assert check_file(report.path, strict_think_markers=True) == (6, 7)  # SpecForge's validator rules
    by_id = {r["id"]: r["conversations"] for r in lines}
    assert by_id["multi"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello!", "reasoning_content": "greet"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "that's all"},
    ]
    # The server sent the reasoning apart *and* left the block in the text: the block is gone (its
    # text is already in the reasoning, so it is not repeated there).
    assert by_id["think"][-1] == {"role": "assistant", "content": "It is 4.",
                                  "reasoning_content": "2 and 2 make 4"}


def test_specforge_writes_truncated_items_only_when_asked_and_marks_them(run, tmp_path):
    run_dir, ids = run
    default = read_jsonl(export_run(run_dir, "specforge").path)
    assert "trunc" not in {r["id"] for r in default}
    both = read_jsonl(export_run(run_dir, "specforge", statuses=["done", "truncated"],
                                 output=tmp_path / "both.jsonl").path)
    marked = [r for r in both if r.get("truncated")]
    assert [r["id"] for r in marked] == ["trunc"] and marked[0]["status"] == "success"
    assert all(problems(r, documented("harvest.export.specforge/1")) == [] for r in both)
    assert check_file(tmp_path / "both.jsonl") == (7, 8)


def test_specforge_never_writes_an_empty_answer_as_a_success(tmp_path):
    """A ledger holding answers with no text (an engine that stopped at once, stored as done by a
    harvest before empty answers had their own outcome) exports none of them."""
    run_dir = tmp_path / "run"
    good = item("good", 1, ("system", ""), ("user", "hi"))
    empty = item("empty", 2, ("user", "hi there"))
    blank = item("blank", 3, ("user", "and you?"))
    thinking = item("thinking", 4, ("user", "think"))
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest([good, empty, blank, thinking])
        ledger.claim(10)
        ledger.complete([Completion("good", output(good, ["hello"])), Completion("empty", output(empty, [""])),
                         Completion("blank", output(blank, [" \n "])),
                         Completion("thinking", output(thinking, [""], reasoning=["still thinking"]))])
    report = export_run(run_dir, "specforge")
    lines = read_jsonl(report.path)
    assert [r["id"] for r in lines] == ["good", "thinking"]  # an answer kept as reasoning only is allowed
    assert lines[0]["conversations"][0] == {"role": "user", "content": "hi"}  # the empty system message left out
    assert report.malformed == 2
    assert {i for i, _ in report.malformed_examples} == {"empty", "blank"}
    assert all("empty" in why for _, why in report.malformed_examples)
    check_file(report.path, strict_empty_answers=False)
    with pytest.raises(SpecForgeRejects, match="content must be a non-empty string"):
        check_file(report.path)  # the stricter rule: the reasoning-only answer has no content


def test_sharegpt_default_is_specforge_shape_and_from_value_maps_roles(run, tmp_path):
    run_dir, ids = run
    same = export_run(run_dir, "sharegpt", statuses=["done", "truncated"])
    spec = export_run(run_dir, "specforge", statuses=["done,truncated"], output=tmp_path / "spec.jsonl")
    assert read_jsonl(same.path) == [{"id": r["id"], "conversations": r["conversations"]}
                                     for r in read_jsonl(spec.path)]
    assert all(problems(r, documented("harvest.export.conversations/1")) == [] for r in read_jsonl(same.path))
    with pytest.raises(SpecForgeRejects, match="status must be 'success'"):
        check_file(same.path)  # the plain ShareGPT shape is not what SpecForge's validator takes
    classic = export_run(run_dir, "sharegpt", sharegpt_style="from-value", output=tmp_path / "classic.jsonl")
    lines = read_jsonl(classic.path)
    assert all(problems(r, documented("harvest.export.sharegpt-from-value/1")) == [] for r in lines)
    multi = next(r for r in lines if r["id"] == "multi")["conversations"]
    assert [t["from"] for t in multi] == ["system", "human", "gpt", "human", "gpt"]
    assert multi[2] == {"from": "gpt", "value": "hello!", "reasoning_content": "greet"}
    assert check_export(classic.path, "sharegpt", sharegpt_style="from-value").ok
    # Read as role/content, the same file is wrong: the checker does look at the roles.
    assert not check_export(classic.path, "sharegpt").ok


def test_status_filter_selects_items_and_refuses_what_a_format_cannot_hold(run, tmp_path):
    run_dir, ids = run
    only_trunc = export_run(run_dir, "specforge", statuses=["truncated"], output=tmp_path / "t.jsonl")
    assert [r["id"] for r in read_jsonl(only_trunc.path)] == ["trunc"]
    both = export_run(run_dir, "specforge", statuses=["done", "truncated"], output=tmp_path / "b.jsonl")
    assert sorted(r["id"] for r in read_jsonl(both.path)) == sorted(ids["done"] + ids["truncated"])
    with pytest.raises(ConfigError, match="cannot hold failed"):
        export_run(run_dir, "sharegpt", statuses=["failed"], output=tmp_path / "f.jsonl")
    with pytest.raises(ConfigError, match="unknown status 'finished'"):
        export_run(run_dir, "specforge", statuses=["finished"])
    with pytest.raises(ConfigError, match="sharegpt format only"):
        export_run(run_dir, "specforge", sharegpt_style="from-value")
    assert not (tmp_path / "f.jsonl").exists()


def test_openai_batch_lines_answers_and_errors(run, tmp_path):
    run_dir, ids = run
    out = tmp_path / "batch.jsonl"
    report = export_run(run_dir, "openai-batch", statuses=["done", "truncated", "failed", "skipped"],
                        output=out)
    lines = read_jsonl(out)
    expected = ["plain", "think", "multi", "trunc", "bad400", "bad422", "skip:data.jsonl:7",
                *ids["done"][3:]]
    assert [r["custom_id"] for r in lines] == expected
    assert report.written == len(expected) and dict(report.by_status) == {
        "done": 6, "truncated": 1, "failed": 2, "skipped": 1}
    schema = documented("harvest.export.openai-batch/1")
    assert [p for r in lines for p in problems(r, schema)] == []
    assert len({r["id"] for r in lines}) == len(lines) and check_export(out, "openai-batch").ok
    by_id = {r["custom_id"]: r for r in lines}
    failed = by_id["bad400"]
    assert failed["response"] is None
    assert failed["error"] == {"code": "http_400", "message": "HTTP 400: prompt is too long for the context"}
    assert by_id["skip:data.jsonl:7"]["error"] == {"code": "input", "message": "bad JSON: x"}
    trunc = by_id["trunc"]["response"]
    assert trunc["status_code"] == 200 and trunc["body"]["choices"][0]["finish_reason"] == "length"
    body = by_id["multi"]["response"]["body"]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "that's all"}
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17}  # the last turn
    assert body["model"] == "tiny-llama" and body["system_fingerprint"] == SETTINGS
    assert by_id["think"]["response"]["body"]["choices"][0]["message"]["content"] == "It is 4."
    # Ids derive from the item: exporting again writes the same bytes.
    again = export_run(run_dir, "openai-batch", statuses=["done,truncated,failed,skipped"],
                       output=tmp_path / "again.jsonl")
    assert again.path.read_bytes() == out.read_bytes()


def test_parquet_in_row_groups_with_errors_for_failed_rows(run, tmp_path):
    require("pyarrow", "the parquet export is written and read back with pyarrow")
    import pyarrow.parquet as pq
    run_dir, ids = run
    report = export_run(run_dir, "parquet", statuses=["done", "truncated", "failed"], row_group_size=2)
    assert report.path == run_dir / "export.parquet"
    f = pq.ParquetFile(str(report.path))
    assert f.metadata.num_rows == report.written == 9
    assert f.metadata.num_row_groups == 5  # 9 rows, 2 per group
    rows = {r["id"]: r for r in f.read().to_pylist()}
    assert sorted(rows) == sorted(ids["done"] + ids["truncated"] + ids["failed"])
    assert rows["bad422"]["conversations"] is None and rows["bad422"]["error_class"] == "http_422"
    assert rows["multi"]["conversations"][2] == {"role": "assistant", "content": "hello!",
                                                 "reasoning_content": "greet"}
    assert rows["multi"]["conversations"][4]["reasoning_content"] is None
    assert (rows["trunc"]["status"], rows["trunc"]["finish_reason"]) == ("truncated", "length")
    assert (rows["multi"]["model"], rows["multi"]["settings_hash"]) == ("tiny-llama", SETTINGS)
    assert check_export(report.path, "parquet").ok


def test_parquet_without_pyarrow_is_a_clear_error_and_writes_nothing(run, monkeypatch):
    run_dir, _ = run
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"--format parquet writes Parquet; install the parquet extra"):
        export_run(run_dir, "parquet")
    assert not default_output(run_dir, "parquet").exists()


# ------------------------------------------------------------------------------------ safety


def test_malformed_results_are_reported_not_written(tmp_path):
    run_dir = tmp_path / "run"
    good, broken, backwards = (item("good", 1, ("user", "a")), item("broken", 2, ("user", "b")),
                               item("backwards", 3, ("user", "c")))
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest([good, broken, backwards])
        ledger.claim(3)
        ledger.complete([
            Completion("good", output(good, ["fine"])),
            Completion("broken", {"text": "no messages here"}),
            Completion("backwards", {"messages": [{"role": "assistant", "content": "x"},
                                                  {"role": "user", "content": "c"}]}),
        ])
    report = export_run(run_dir, "specforge")
    assert [r["id"] for r in read_jsonl(report.path)] == ["good"]
    assert report.malformed == 2
    reasons = dict(report.malformed_examples)
    assert "no 'messages' list" in reasons["broken"] and "do not alternate" in reasons["backwards"]


def test_output_is_replaced_whole_and_no_temporary_file_stays(run, tmp_path):
    run_dir, ids = run
    out = tmp_path / "out.jsonl"
    out.write_text("old content\n" * 1000)
    export_run(run_dir, "specforge", output=out)
    assert [r["id"] for r in read_jsonl(out)] == ids["done"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "run"]
    assert out.stat().st_mode & 0o777 == 0o600


def test_failed_export_leaves_an_existing_output_untouched(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("previous export\n")
    with pytest.raises(LedgerError, match=str(tmp_path / "nothing")):
        export_run(tmp_path / "nothing", "specforge", output=out)
    with pytest.raises(ConfigError, match="does not exist"):
        export_run(tmp_path / "nothing", "specforge", output=tmp_path / "no" / "dir.jsonl")
    assert out.read_text() == "previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def _export_peak(run_dir: Path, n: int) -> tuple[int, int]:
    """Build a run of ``n`` done items, export it; the export's peak traced memory and file size."""
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest(item(f"id{i:06d}", i + 1, ("user", f"question number {i} " + "q" * 200))
                      for i in range(n))
        while rows := ledger.claim(5000):
            ledger.complete([Completion(r.id, output(r.item, ["a" * 300])) for r in rows])
    tracemalloc.start()
    try:
        report = export_run(run_dir, "specforge")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.written == n
    return peak, report.path.stat().st_size


@pytest.mark.slow
def test_memory_stays_flat_while_exporting_many_rows(tmp_path):
    """The export streams: four times the rows, the same peak Python memory."""
    small_peak, small_size = _export_peak(tmp_path / "small", 2_500)
    big_peak, big_size = _export_peak(tmp_path / "big", 10_000)
    assert big_size > 3.5 * small_size
    assert big_peak < 1.5 * small_peak, (
        f"peak {small_peak / 2**20:.1f} MiB for {small_size / 2**20:.1f} MiB, "
        f"{big_peak / 2**20:.1f} MiB for {big_size / 2**20:.1f} MiB")


# ------------------------------------------------------------------------------------ helpers


def test_split_think_moves_blocks_out_only_when_reasoning_is_kept_apart():
    assert split_think("<think>a</think>\nanswer", "") == ("answer", "a")
    assert split_think("<think>a</think>answer", "a") == ("answer", "a")  # not repeated
    assert split_think("hidden steps</think>\n\nanswer", "r") == ("answer", "r\n\nhidden steps")
    assert split_think("<think>never closed", "r") == ("", "r\n\nnever closed")
    raw = "<think>a</think>answer"
    assert split_think(raw, None) == (raw, None)  # the run chose not to separate reasoning
    assert split_think("plain", "r") == ("plain", "r")


def test_conversation_problems_names_what_is_wrong():
    ok = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
          {"role": "assistant", "content": "a"}]
    assert conversation_problems(ok) == []
    assert conversation_problems(ok[1:]) == []
    assert any("do not alternate" in p for p in conversation_problems([ok[0], ok[1], ok[1], ok[2]]))
    assert any("does not end with an assistant" in p for p in conversation_problems(ok[:2]))
    assert any("no user turn" in p for p in conversation_problems(ok[:1]))
    leaked = [ok[1], {"role": "assistant", "content": "<think>x</think>a", "reasoning_content": "x"}]
    assert any("raw <think>" in p for p in conversation_problems(leaked))
    assert any("role is 'tool'" in p for p in conversation_problems([ok[1], {"role": "tool", "content": ""}]))


def test_check_export_finds_repeated_ids(tmp_path):
    line = {"id": "a", "status": "success", "conversations": [{"role": "user", "content": "u"},
                                                              {"role": "assistant", "content": "a"}]}
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    check = check_export(path, "specforge")
    assert check.records == 2 and not check.ok and check.problems == ("x.jsonl:2: id 'a' repeated",)
    del line["status"]
    path.write_text(json.dumps(line) + "\n")
    assert check_export(path, "specforge").problems == ("x.jsonl:1: status is None, SpecForge expects 'success'",)


def test_results_in_the_tests_follow_the_documented_result_schema(run):
    """The stored outputs these tests export are the documented shape (guards the fixtures)."""
    run_dir, _ = run
    schema = documented("harvest.result/1")
    with Ledger.open_readonly(run_dir) as ledger:
        outputs = [r.output for r in ledger.iter_results()]
    assert len(outputs) == 7 and [p for o in outputs for p in problems(o, schema)] == []
