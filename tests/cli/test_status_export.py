"""`harvest status` and `harvest export` through the click command: exit codes, the table, --json
against docs/result-schema.md, files written and counts printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harvest.cli.main import cli
from harvest.ledger import Completion, Ledger
from tests.campaign.test_export import SETTINGS, build_run, documented, item, read_jsonl
from tests.gpu.schema_doc import problems
from tests.realparts import require


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    run_dir = tmp_path / "run"
    return run_dir, build_run(run_dir, finished=False)


def test_status_json_matches_the_documented_schema_and_adds_up(run):
    run_dir, ids = run
    result = invoke("status", str(run_dir), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert problems(doc, documented("harvest.status/1")) == []
    assert doc["counts"] == {status: len(v) for status, v in ids.items()}
    assert sum(doc["counts"].values()) == doc["totals"]["unique"] == 13
    assert doc["totals"]["ok"] is False and doc["totals"]["remaining"] == 3
    assert doc["throughput"]["source"] == "ledger" and doc["progress"] is None
    assert [e["id"] for e in doc["last_errors"]] == ["bad422", "bad400"]
    assert doc["failed_by_class"] == {"http_400": 1, "http_422": 1}


def test_status_table_shows_counts_totals_rate_and_errors(run):
    run_dir, _ = run
    result = invoke("status", str(run_dir))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in ("done", "truncated", "pending", "unique input"):
        assert line in out
    assert "done 6 + truncated 1 + failed 2 + skipped 1 = 10 of 13 unique input items" in out
    assert "input: 14 rows, 1 duplicate, 1 skipped" in out
    assert "items/s" in out and "ETA:" in out and "runner:" in out
    assert "HTTP 400: prompt is too long for the context" in out and "http_422" in out


@pytest.mark.parametrize("make", ["missing", "empty", "not-a-db"])
def test_status_of_something_that_is_not_a_run_folder_exits_2_naming_it(tmp_path, make):
    target = tmp_path / "somewhere"
    if make != "missing":
        target.mkdir()
    if make == "not-a-db":
        (target / "ledger.sqlite").write_text("hello")
    result = invoke("status", str(target))
    assert result.exit_code == 2
    said = "does not exist: give a run folder" if make == "missing" else "not a readable harvest run folder"
    assert str(target) in result.stderr and said in result.stderr
    assert "Traceback" not in result.output
    assert invoke("status", str(target), "--json").exit_code == 2


def test_export_writes_the_default_file_and_prints_the_count(run):
    run_dir, ids = run
    result = invoke("export", str(run_dir), "--format", "specforge")
    assert result.exit_code == 0, result.output
    path = run_dir / "export.specforge.jsonl"
    assert f"wrote 6 items to {path} (done 6)" in result.stdout
    assert [r["id"] for r in read_jsonl(path)] == ids["done"]


def test_export_status_filter_and_output_for_openai_batch(run, tmp_path):
    run_dir, _ = run
    out = tmp_path / "batch.jsonl"
    result = invoke("export", str(run_dir), "--format", "openai-batch", "--status", "done,truncated",
                    "--status", "failed", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "wrote 9 items" in result.stdout and "failed 2" in result.stdout
    lines = read_jsonl(out)
    assert sum(1 for r in lines if r["error"] is not None) == 2


def test_export_sharegpt_from_value_and_parquet(run, tmp_path):
    run_dir, _ = run
    out = tmp_path / "classic.jsonl"
    result = invoke("export", str(run_dir), "--format", "sharegpt", "--sharegpt-style", "from-value",
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    assert {t["from"] for r in read_jsonl(out) for t in r["conversations"]} == {"system", "human", "gpt"}
    require("pyarrow", "the parquet export is written and read back with pyarrow")
    import pyarrow.parquet as pq
    result = invoke("export", str(run_dir), "--format", "parquet", "--status", "done,failed,pending")
    assert result.exit_code == 0, result.output
    assert pq.ParquetFile(str(run_dir / "export.parquet")).metadata.num_rows == 10


def test_export_usage_errors_exit_2(run, tmp_path):
    run_dir, _ = run
    refused = invoke("export", str(run_dir), "--format", "sharegpt", "--status", "failed")
    assert refused.exit_code == 2 and "cannot hold failed" in refused.stderr
    assert not (run_dir / "export.sharegpt.jsonl").exists()
    unknown = invoke("export", str(run_dir), "--format", "specforge", "--status", "finished")
    assert unknown.exit_code == 2 and "unknown status 'finished'" in unknown.stderr
    nowhere = invoke("export", str(tmp_path / "nothing"), "--format", "specforge")
    assert nowhere.exit_code == 2 and str(tmp_path / "nothing") in nowhere.stderr
    assert invoke("export", str(run_dir), "--format", "csv").exit_code == 2


def test_export_of_malformed_results_exits_1_naming_them(tmp_path):
    run_dir = tmp_path / "run"
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest([item("ok", 1, ("user", "a")), item("odd", 2, ("user", "b"))])
        ledger.claim(2)
        ledger.complete([Completion("ok", {"messages": [{"role": "user", "content": "a"},
                                                        {"role": "assistant", "content": "b"}]}),
                         Completion("odd", "just a string")])
    result = invoke("export", str(run_dir), "--format", "specforge")
    assert result.exit_code == 1
    assert "wrote 1 items" in result.stdout
    assert "odd: output has no 'messages' list" in result.stderr
    assert [r["id"] for r in read_jsonl(run_dir / "export.specforge.jsonl")] == ["ok"]


def test_a_logprobs_export_counts_items_and_says_its_rows_apart(tmp_path):
    # 2 inputs x 2 samples, each answer of 2 turns with log-probabilities, and 1 answer without:
    # 4 items exported in 8 rows (one per sample and turn); before, "wrote 8 items (rows 8)"
    require("pyarrow", "the logprobs export writes Parquet")
    import numpy as np

    from harvest.ledger.logprobs import TurnLogprobs, encode
    from tests.ledger.ledger_testdata import synthetic

    def turn(n: int) -> TurnLogprobs:
        return TurnLogprobs(np.arange(n, dtype=np.int32), np.full(n, -0.5, np.float16),
                            np.zeros((n, 2), np.int32), np.full((n, 2), -1.0, np.float16))

    run_dir = tmp_path / "run"
    with Ledger.open(run_dir, settings_hash="h", samples=2) as ledger:
        ledger.ingest(synthetic(3))
        rows = ledger.claim(6)
        ledger.complete([Completion(r.id, {"turns": []}, sample=r.sample, logprobs=encode([turn(3), turn(2)], 2))
                         for r in rows[:4]] + [Completion(rows[4].id, {"turns": []}, sample=rows[4].sample)])
    result = invoke("export", str(run_dir), "--format", "logprobs", "-o", str(tmp_path / "lp.parquet"))
    assert result.exit_code == 0, result.output
    assert f"wrote 4 items in 8 rows (one per sample and turn) to {tmp_path / 'lp.parquet'} (done 4)" in \
        result.stdout, result.stdout
