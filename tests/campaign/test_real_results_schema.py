"""The documented result schema (harvest.result/1, docs/result-schema.md) checked on what a real run
stored: the shared llama-server answers prompt rows, OpenAI ``messages`` rows with a system turn and
several user turns (history regenerated), and ShareGPT rows; every stored output must follow the
schema, and the SpecForge export of the same run passes the restated rules and harvest's own check.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from harvest.campaign.outputs.export import check_export, export_run
from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Ledger, Status
from tests.campaign.specforge_rules import check_file
from tests.campaign.test_export import documented
from tests.gpu.schema_doc import problems

pytestmark = pytest.mark.engine


def rows() -> list[dict]:
    out: list[dict] = []
    for i in range(4):
        out.append({"id": f"p{i}", "prompt": f"Name a colour, {i}."})
        out.append({"id": f"m{i}", "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"Count to {i + 2}."},
            {"role": "assistant", "content": "1, 2."},
            {"role": "user", "content": "And back?"}]})
        out.append({"id": f"s{i}", "conversations": [
            {"from": "human", "value": f"Say hello {i} times."}, {"from": "gpt", "value": "hello"}]})
    return out


def test_a_real_runs_results_follow_the_documented_schema(tmp_path, llama_server):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    run_dir = tmp_path / "run"
    config = parse_config({
        "data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 12},
        "client": {"endpoints": [llama_server.url], "concurrency": 4, "health_deadline": 60},
        "run": {"history": "regenerated"}, "output": {"dir": str(run_dir)}})
    report = asyncio.run(run_campaign(config))
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    answered = report.totals.counts[Status.DONE] + report.totals.counts[Status.TRUNCATED]
    assert answered == len(rows())

    schema = documented("harvest.result/1")
    with Ledger.open_readonly(run_dir) as ledger:
        outputs = [r.output for r in ledger.iter_results()]
    assert len(outputs) == answered
    found = [f"result {i}: {p}" for i, o in enumerate(outputs) for p in problems(o, schema)]
    assert found == [], found[:10]

    out = export_run(run_dir, "specforge", statuses=["done", "truncated"])
    assert out.written == answered, out
    assert check_export(out.path, "specforge").problems == ()
    rows_checked, answers = check_file(out.path, strict_empty_answers=False)
    assert rows_checked == answered and answers >= answered  # messages rows: two regenerated turns
