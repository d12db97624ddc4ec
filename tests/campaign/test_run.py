"""The campaign runner against real engines (the shared vLLM CPU server, llama-server) and a real
SQLite ledger: totals add up, bad rows are skipped with line and reason, truncation policies apply,
multi-turn turns are regenerated in order, and several endpoints share the load."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Ledger, Status

pytestmark = pytest.mark.engine


def job(tmp_path: Path, data: Path, endpoints: list[str], **tables) -> object:
    raw = {"data": {"path": str(data), "id_field": "id"},
           "sampling": {"max_tokens": 16, "temperature": 0.0},
           "client": {"endpoints": endpoints, "concurrency": 16, "health_deadline": 30, "max_retries": 2},
           "output": {"dir": str(tmp_path / "run")},
           "run": {"progress_interval": 0.5}}
    for name, values in tables.items():
        raw.setdefault(name, {}).update(values)
    return parse_config(raw, source=str(tmp_path / "job.toml"))


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def results(run_dir: Path) -> dict[str, object]:
    ledger = Ledger.open_readonly(run_dir)
    try:
        return {r.item_id: r for r in ledger.iter_results(statuses=tuple(Status))}
    finally:
        ledger.close()


def test_bad_rows_are_skipped_with_line_and_the_rest_completes(tmp_path, vllm_server):
    good = [json.dumps({"id": f"p{i}", "prompt": f"Question number {i}?"}).encode() for i in range(20)]
    bad = [
        b'{"id": "broken", "prompt": ',                                   # line 21: bad JSON
        json.dumps({"id": "noprompt", "text": "x"}).encode(),              # line 22: missing field
        json.dumps({"id": "typed", "prompt": 42}).encode(),                # line 23: wrong type
        json.dumps({"id": "empty", "messages": []}).encode(),              # line 24: empty conversation
        b'{"id": "utf", "prompt": "caf\xe9 \xff"}',                        # line 25: invalid UTF-8
        json.dumps({"id": "p3", "prompt": "Question number 3?"}).encode(),  # line 26: duplicate id
    ]
    huge = json.dumps({"id": "huge", "prompt": "word " * 200_000}).encode()  # ~1 MB prompt: too long for the model
    data = write_lines(tmp_path / "in.jsonl", good + bad + [huge])
    report = asyncio.run(run_campaign(job(tmp_path, data, [vllm_server.url])))

    assert report.outcome == "finished"
    assert report.totals.ok, report.totals.describe()
    c = report.totals.counts
    assert c[Status.DONE] + c[Status.TRUNCATED] == 20
    assert c[Status.SKIPPED] == 6  # 5 bad rows, and the 1 MB prompt: never sent (campaign/run/context.py)
    assert c[Status.FAILED] == 0
    assert report.totals.duplicates == 1
    rows = results(tmp_path / "run")
    skipped = {r.source_line: r.last_error for r in rows.values() if r.status is Status.SKIPPED}
    assert sorted(skipped) == [21, 22, 23, 24, 25, 27]
    assert all(reason for reason in skipped.values())
    # vLLM's /tokenize counted it with the chat template; the limit is vLLM's own max_model_len.
    too_long = rows["huge"]
    assert too_long.error_class == "context_length"
    assert too_long.attempts == 0  # never sent
    tokens = int(too_long.last_error.split()[2])
    assert tokens > 200_000, too_long.last_error
    assert too_long.last_error.endswith("+ max_tokens 16 does not fit the model's context of 2048 tokens "
                                        "(max_model_len on /v1/models)"), too_long.last_error


def test_truncation_policies(tmp_path, vllm_server):
    data = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": f"t{i}", "prompt": f"Tell me about {i}."}).encode()
                                               for i in range(6)])
    # The random model never emits EOS: every answer runs to max_tokens.
    keep = asyncio.run(run_campaign(job(tmp_path / "keep", data, [vllm_server.url],
                                        run={"truncated": "keep"})))
    assert keep.totals.counts[Status.TRUNCATED] == 6
    out = next(iter(results(tmp_path / "keep" / "run").values())).output
    assert out["turns"][0]["finish_reason"] == "length" and out["turns"][0]["completion_tokens"] == 16

    retry = asyncio.run(run_campaign(job(tmp_path / "retry", data, [vllm_server.url],
                                         run={"truncated": "retry", "retry_max_tokens": 24})))
    assert retry.totals.counts[Status.TRUNCATED] == 6
    out = next(iter(results(tmp_path / "retry" / "run").values())).output
    assert out["turns"][0]["completion_tokens"] == 24  # the retry's answer is the one kept

    drop = asyncio.run(run_campaign(job(tmp_path / "drop", data, [vllm_server.url],
                                        run={"truncated": "drop"})))
    assert drop.totals.ok and drop.totals.counts[Status.FAILED] == 6
    rows = results(tmp_path / "drop" / "run")
    assert {r.error_class for r in rows.values()} == {"truncated"}
    assert all(r.output is None for r in rows.values())


def test_multi_turn_regenerates_each_turn_on_the_regenerated_history(tmp_path, vllm_server):
    conv = {"id": "c1", "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "First question?"}, {"from": "gpt", "value": "ORIGINAL ONE"},
        {"from": "human", "value": "Second question?"}, {"from": "gpt", "value": "ORIGINAL TWO"},
        {"from": "human", "value": "Third question?"}]}
    data = write_lines(tmp_path / "in.jsonl", [json.dumps(conv).encode()])
    report = asyncio.run(run_campaign(job(tmp_path, data, [vllm_server.url])))
    assert report.totals.ok
    out = results(tmp_path / "run")["c1"].output
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in out["messages"] if m["role"] == "user"] == [
        "First question?", "Second question?", "Third question?"]
    replies = [m["content"] for m in out["messages"] if m["role"] == "assistant"]
    assert "ORIGINAL ONE" not in replies and "ORIGINAL TWO" not in replies
    turns = out["turns"]
    assert len(turns) == 3
    # Each turn's prompt holds the previous prompt, its regenerated answer and the new question.
    for before, after in zip(turns, turns[1:]):
        assert after["prompt_tokens"] > before["prompt_tokens"] + before["completion_tokens"]


def test_original_history_mode_sends_the_input_turns(tmp_path, vllm_server):
    conv = {"id": "c2", "messages": [
        {"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "short"},
        {"role": "user", "content": "Again?"}]}
    data = write_lines(tmp_path / "in.jsonl", [json.dumps(conv).encode()])
    report = asyncio.run(run_campaign(job(tmp_path, data, [vllm_server.url], run={"history": "original"})))
    assert report.totals.ok
    turns = results(tmp_path / "run")["c2"].output["turns"]
    # Turn 1 was sent on top of the one-word original answer, not on the 16-token regenerated one.
    assert turns[1]["prompt_tokens"] < turns[0]["prompt_tokens"] + turns[0]["completion_tokens"] + 8


def test_two_endpoints_both_receive_traffic(tmp_path, vllm_server, llama_server):
    data = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": f"e{i}", "prompt": f"Item {i}"}).encode()
                                               for i in range(60)])
    report = asyncio.run(run_campaign(job(tmp_path, data, [vllm_server.url, llama_server.url])))
    assert report.totals.ok
    endpoints = {r.output["turns"][0]["endpoint"] for r in results(tmp_path / "run").values()}
    assert endpoints == {vllm_server.url, llama_server.url}


def test_resume_with_changed_sampling_is_refused_unless_allowed(tmp_path, vllm_server):
    from harvest.errors import LedgerError

    data = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": "a", "prompt": "x"}).encode()])
    asyncio.run(run_campaign(job(tmp_path, data, [vllm_server.url])))
    changed = job(tmp_path, data, [vllm_server.url], sampling={"max_tokens": 8})
    with pytest.raises(LedgerError) as err:
        asyncio.run(run_campaign(changed))
    assert "allow" in str(err.value).lower() or "hash" in str(err.value).lower()
    report = asyncio.run(run_campaign(changed, allow_mixed=True))
    assert report.totals.ok
