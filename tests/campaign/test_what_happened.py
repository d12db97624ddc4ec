"""What harvest shows is what happened, on a real engine (the shared llama-server, an endpoint harvest
does not manage: ``engine = "openai"``), through the ``harvest`` command as a person runs it:

- the configured model is the one asked for: one the server does not list is refused at start with
  the list it serves; the served one is what the export and ``harvest status`` record;
- rows of an unexpected shape: every row skipped exits non-zero with the reason and the fix; after
  fixing ``[data]`` the same folder reads them again and finishes with every row done; more than
  ``max_skipped_share`` skipped exits non-zero; ``--retry skipped`` gives skipped items another go;
- a folder of another job names the settings that differ;
- an endpoint that never answers ends the run after ``[client] start_deadline``, not the health
  deadline; Parquet ``attempts`` counts attempts, not turns.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests import harvest_process

pytestmark = pytest.mark.engine


def harvest(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest.cli.main", *argv], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)


def served(url: str) -> list[str]:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return [m["id"] for m in json.loads(r.read())["data"]]


def write_job(folder: Path, url: str, model: str | None, *, out: str = "run", **tables: dict[str, Any]) -> Path:
    """A job file as a person writes it for a server that is already running (``[data] path`` is
    ``in.jsonl`` unless ``data`` says otherwise)."""
    server = {"engine": "openai", "base_url": url, **({"model": model} if model else {})}
    raw: dict[str, dict[str, Any]] = {"server": server, "data": {"path": "in.jsonl"},
                                      "sampling": {"max_tokens": 8}, "client": {"concurrency": 4},
                                      "output": {"dir": out}}
    for name, values in tables.items():
        raw.setdefault(name, {}).update(values)
    lines = []
    for name, values in raw.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    job = folder / "job.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


def rows(path: Path, items: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))


def status(folder: Path, target: str = "job.toml") -> dict[str, Any]:
    proc = harvest("status", target, "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_model_the_endpoint_does_not_serve_is_refused_with_the_list(tmp_path, llama_server):
    names = served(llama_server.url)
    two_turns = {"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                              {"role": "user", "content": "And then?"}]}
    rows(tmp_path / "in.jsonl", [{"prompt": f"Say {i}."} for i in range(5)] + [two_turns])
    write_job(tmp_path, llama_server.url, "model-b")
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "[server] model:" in x)
    assert "[server] model: 'model-b' is not served by " + llama_server.url in line, proc.stderr
    assert all(repr(n) in line for n in names), (names, line)
    st = status(tmp_path)
    assert st["counts"]["pending"] == 6 and st["counts"]["done"] == 0  # nothing was sent, nothing lost

    # The served name: asked for, and recorded by the export and by status.
    write_job(tmp_path, llama_server.url, names[0], out="run2")
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert status(tmp_path)["model"] == names[0]
    proc = harvest("export", "job.toml", "--format", "parquet", "--status", "done,truncated", "-o", "out.parquet",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert len(table) == 6 and {r["model"] for r in table} == {names[0]}
    # attempts count attempts: the two-turn item, never retried, was attempted once (two requests)
    assert [len(r["conversations"]) for r in table].count(4) == 1
    assert {r["attempts"] for r in table} == {1}


def test_every_row_skipped_exits_non_zero_then_fixing_data_finishes_them_all(tmp_path, llama_server):
    model = served(llama_server.url)[0]
    rows(tmp_path / "in.jsonl", [{"qid": i, "question": f"What is {i} + {i}?"} for i in range(20)])
    write_job(tmp_path, llama_server.url, model, data={"path": "in.jsonl", "id_field": "qid"})
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    # The input line says every row was skipped, not that the rows lack the id field they all have.
    (line,) = [x for x in out.splitlines() if x.startswith("input: ")]
    assert line == ("input: 20 rows, 20 unique, 0 duplicates, 20 skipped; "
                    "ids: none (every row was skipped; [data] id_field 'qid')"), line
    assert "content hashes" not in out and "no 'qid' field" not in out, out
    # The reason with its count (naming the rows' fields), at the input line and at the end, and the fix.
    assert out.count("skipped 20: no 'prompt', 'messages' or 'conversations' field; the row has 'qid', "
                     "'question'") >= 2, out
    assert "fix: the rows do not fit [data]: set prompt_field" in out
    assert "FAILED: every input row (20) was skipped" in proc.stderr
    st = status(tmp_path)
    assert st["counts"]["skipped"] == 20
    (reason,) = st["skipped_reasons"]
    assert reason["error_class"] == "shape" and reason["count"] == 20 and "prompt_field" in reason["hint"]
    assert reason["example"]["line"] == 1
    table = harvest("status", "job.toml", cwd=tmp_path)
    assert "skipped 20: no 'prompt'" in table.stdout and "fix:" in table.stdout

    # Export of nothing: the cause and the fix, exit 1 and no file, unless asked for.
    proc = harvest("export", "job.toml", "--format", "sharegpt", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == ("error: --format sharegpt: no item of status done to export (the run holds "
                                   "skipped 20): pick other statuses with --status, or --allow-empty to write an "
                                   "empty file; no file written"), proc.stderr
    assert not list((tmp_path / "run").glob("export*")), "an empty export was left behind"
    assert harvest("export", "job.toml", "--format", "sharegpt", "--allow-empty", cwd=tmp_path).returncode == 0
    assert (tmp_path / "run" / "export.sharegpt.jsonl").is_file()

    # Fixed [data]: the same folder reads the skipped rows again and finishes every one.
    write_job(tmp_path, llama_server.url, model, data={"path": "in.jsonl", "id_field": "qid",
                                                       "prompt_field": "question"})
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped rows read again ([data] prompt_field 'prompt' -> 'question'): 20 are now items" in proc.stderr
    st = status(tmp_path)
    assert st["counts"]["done"] + st["counts"]["truncated"] == 20 and st["counts"]["skipped"] == 0, st["counts"]
    assert st["totals"]["ok"] and st["totals"]["unique"] == 20 and st["skipped_reasons"] == []

    # Log-probabilities from a run that stored none: the cause, the fix, no file.
    proc = harvest("export", "job.toml", "--format", "logprobs", "--status", "done,truncated", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == ("error: --format logprobs: none of the run's 20 selected results carries "
                                   "log-probabilities (they ran with [sampling] logprobs = 0): set [sampling] "
                                   "logprobs = K for a new run, or export another format; no file written")
    assert not (tmp_path / "run" / "export.logprobs.parquet").exists()
    # Without pyarrow (an import that fails, as in an environment without the parquet extra): the
    # format named, and how to install it from a clone.
    no_pyarrow = ("import sys; sys.modules['pyarrow'] = None; sys.argv[0] = 'harvest'; "
                  "from harvest.cli.main import main; main()")
    for fmt in ("parquet", "logprobs"):
        proc = subprocess.run([sys.executable, "-c", no_pyarrow, "export", "job.toml", "--format", fmt],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
        assert proc.returncode == 2, proc.stderr
        assert f"harvest export --format {fmt}" in proc.stderr and f"--format {fmt} writes Parquet" in proc.stderr
        assert "pip install -e '.[parquet]'" in proc.stderr and "harvest[parquet]" not in proc.stderr
        assert not list((tmp_path / "run").glob("*.parquet"))


def test_more_than_the_skipped_share_exits_non_zero_and_retry_skipped_recovers(tmp_path, llama_server):
    model = served(llama_server.url)[0]
    good = [{"prompt": f"Name {i}."} for i in range(4)]
    rows(tmp_path / "in.jsonl", good + [{"text": f"x{i}"} for i in range(6)])
    write_job(tmp_path, llama_server.url, model)
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: 6 of 10 input rows were skipped (60%, more than [data] max_skipped_share 50%)" in proc.stderr
    assert status(tmp_path)["counts"]["done"] + status(tmp_path)["counts"]["truncated"] == 4  # the good ones

    # Items skipped after ingest (a prompt over max_prompt_tokens) come back with --retry skipped.
    rows(tmp_path / "long.jsonl", [{"prompt": "word " * 40 + str(i)} for i in range(3)])
    write_job(tmp_path, llama_server.url, model, data={"path": "long.jsonl", "max_prompt_tokens": 5}, out="run-long")
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # every row skipped
    assert "FAILED: every input row (3) was skipped" in proc.stderr
    st = status(tmp_path)
    assert st["counts"]["skipped"] == 3 and st["skipped_reasons"][0]["error_class"] == "context_length"
    assert "max_prompt_tokens" in st["skipped_reasons"][0]["hint"]
    write_job(tmp_path, llama_server.url, model, data={"path": "long.jsonl", "max_prompt_tokens": 500},
              out="run-long")
    proc = harvest("run", "job.toml", "--retry", "skipped", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = status(tmp_path)
    assert st["counts"]["done"] + st["counts"]["truncated"] == 3 and st["counts"]["skipped"] == 0, st["counts"]


def test_a_folder_of_another_job_names_what_differs(tmp_path, llama_server):
    model = served(llama_server.url)[0]
    rows(tmp_path / "in.jsonl", [{"prompt": f"Say {i}."} for i in range(3)])
    rows(tmp_path / "other.jsonl", [{"prompt": f"Other {i}."} for i in range(3)])
    write_job(tmp_path, llama_server.url, model, sampling={"max_tokens": 256})
    assert harvest("run", "job.toml", cwd=tmp_path).returncode == 0
    write_job(tmp_path, llama_server.url, model, data={"path": "other.jsonl"}, sampling={"max_tokens": 64})
    proc = harvest("run", "job.toml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "belongs to another job" in err and "[sampling] max_tokens: 256 -> 64" in err, err
    assert "[data] path: " in err and "in.jsonl -> " in err and "other.jsonl" in err, err
    assert "changed since" not in err and "hash" not in err, err


def test_an_endpoint_that_never_answers_ends_after_the_start_deadline(tmp_path):
    # A listener that accepts and never answers: an endpoint that is "up" but sick.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        rows(tmp_path / "in.jsonl", [{"prompt": "hi"}])
        write_job(tmp_path, url, "m", client={"start_deadline": 4, "health_deadline": 600})
        t0 = time.monotonic()
        proc = harvest("run", "job.toml", cwd=tmp_path, timeout=120)
        took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "did not answer within [client] start_deadline 4 s" in proc.stdout, proc.stdout
    assert "GET /v1/models gave no answer within" in proc.stdout, proc.stdout
    assert took < 90, took  # the 600 s health deadline was not waited
    assert status(tmp_path)["counts"]["pending"] == 1


def test_a_first_batch_all_skipped_stops_before_anything_is_sent(tmp_path, monkeypatch):
    """A dataset longer than one ingest batch whose first batch is all skipped: the run stops before
    it would launch or send (no endpoint is asked: the one named does not exist), the rest of the
    file left to be read next time under fixed settings."""
    import asyncio

    from harvest.campaign.run import intake
    from tests.placed import run_campaign
    from harvest.config import parse_config
    from harvest.ledger import Status

    monkeypatch.setattr(intake, "INGEST_BATCH", 10)  # a batch of 10 rows stands for 10,000
    rows(tmp_path / "in.jsonl", [{"qid": i, "question": f"q{i}"} for i in range(25)])

    def config(**data: Any) -> Any:
        return parse_config({"server": {"engine": "openai", "base_url": "http://127.0.0.1:9", "model": "m"},
                             "data": {"path": str(tmp_path / "in.jsonl"), **data},
                             "output": {"dir": str(tmp_path / "run")}}, source=str(tmp_path / "job.toml"))

    report = asyncio.run(run_campaign(config()))
    assert report.outcome == "stopped" and "rows read first were all skipped" in (report.note or ""), report
    assert not report.ok and report.totals.counts[Status.SKIPPED] == 10
    assert report.skip_reasons and report.skip_reasons[0].error_class == "shape"


def test_the_configured_model_is_asked_for_on_a_server_with_several(tmp_path):
    """The issue's case: a server listing model-a and model-b, `model = "model-b"`: every request
    asks for model-b (the stand-in answers with the model asked for, and refuses one it does not
    list), and the export and status record it; the report header says it."""
    from tests.client.fakes import LiveServer

    server = LiveServer("--models", "model-a,model-b")
    try:
        rows(tmp_path / "in.jsonl", [{"prompt": f"Say {i}."} for i in range(5)])
        write_job(tmp_path, server.url, "model-b")
        proc = harvest("run", "job.toml", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert harvest("export", "job.toml", "--format", "openai-batch", "-o", "out.jsonl", cwd=tmp_path).returncode == 0
        models = {json.loads(line)["response"]["body"]["model"] for line in (tmp_path / "out.jsonl").read_text().splitlines()}
        assert models == {"model-b"}
        assert status(tmp_path)["model"] == "model-b"
        assert harvest("report", "run", "-o", "report.html", cwd=tmp_path).returncode == 0
        assert "<dt>model</dt><dd>model-b</dd>" in (tmp_path / "report.html").read_text()
    finally:
        server.kill()
