"""Mistakes that would burn a whole run, through ``harvest run`` against the deterministic chat
stand-in (tests/quality/chat_engine.py, launched and stopped by harvest as a ``command`` engine):

- a server that answers HTTP 400 to every request: the breaker stops the run within its window,
  exit 1 with the server's message and what to change, every item left pending and uncharged; the
  fixed job (same output settings) then finishes;
- empty answers: failed with class ``empty`` after one more ask, never done, never exported;
  ``--retry failed`` regenerates them once the server answers, counts add up, no duplicates;
- ``--retry`` under changed output settings is refused by the settings-hash rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harvest.ledger import Ledger, Status
from tests import engines, harvest_process

# The chat stand-in and vLLM, launched and stopped by harvest.
pytestmark = pytest.mark.engine

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"
REJECTION = "stop: at most 4 stop strings are supported, got 5"


@pytest.fixture(autouse=True)
def harvest_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("HARVEST_STATE_DIR", str(d))
    return d


def write_job(path: Path, data: Path, engine_flags: list[str], *, window: int = 5,
              max_tokens: int = 8) -> Path:
    command = [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}", *engine_flags]
    path.write_text(f"""
[server]
engine = "command"
port = {engines.free_port()}
command = {json.dumps(command)}
health_url = "http://{{host}}:{{port}}/health"
ready_timeout = 30
stop_grace = 2
stop_deadline = 10

[preflight]
min_disk_free_gib = 0.05

[data]
path = {json.dumps(str(data))}
id_field = "id"

[sampling]
max_tokens = {max_tokens}

[client]
concurrency = 2
max_retries = 0
health_deadline = 20

[run]
breaker_window = {window}
progress_interval = 0.5

[output]
dir = {json.dumps(str(path.parent / "run"))}
""")
    return path


def harvest(*argv: str) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest.cli.main", *argv], capture_output=True, text=True,
                               timeout=300, stdin=subprocess.DEVNULL, env=dict(os.environ))


def rows(run_dir: Path) -> dict[str, object]:
    ledger = Ledger.open_readonly(run_dir)
    try:
        return {r.item_id: r for r in ledger.iter_results(statuses=tuple(Status))}
    finally:
        ledger.close()


def test_a_job_the_server_rejects_stops_within_the_window_and_finishes_once_fixed(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Question {i}?"}) + "\n"
                            for i in range(60)))
    requests = tmp_path / "requests.log"
    job = write_job(tmp_path / "job.toml", data, ["--reject", "400", "--reject-message", REJECTION,
                                                  "--request-log", str(requests)])
    proc = harvest("run", str(job), "--no-live")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "STOPPED" in proc.stderr and REJECTION in proc.stderr and "http_400" in proc.stderr
    assert "[sampling]" in proc.stderr  # what to change
    assert "60 items not finished are pending" in proc.stderr
    sent = requests.read_text().splitlines()
    # the window (5) plus at most what was claimed beside it (2 x concurrency 2)
    assert 5 <= len(sent) <= 5 + 4, sent
    got = rows(tmp_path / "run")
    assert {r.status for r in got.values()} == {Status.PENDING}
    assert all(r.attempts == 0 for r in got.values())  # uncharged

    # The fix is on the server side (its command is no output setting): same hash, it resumes.
    write_job(job, data, [])
    proc = harvest("run", str(job), "--no-live")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(tmp_path / "run")
    assert len(got) == 60 and {r.status for r in got.values()} <= {Status.DONE, Status.TRUNCATED}
    assert "OK    " in proc.stdout


def test_empty_answers_fail_and_retry_failed_regenerates_them(tmp_path):
    prompts = [f"Question {i}?" for i in range(8)] + ["Say nothing [empty]", "Again nothing [empty]",
                                                      "Only spaces [blank]", "Hesitate [empty-once]"]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"e{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    job = write_job(tmp_path / "job.toml", data, ["--empty-answers"])
    proc = harvest("run", str(job), "--no-live")
    # failed items are a final status: the run is complete, and reports them
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(tmp_path / "run")
    failed = {k for k, r in got.items() if r.status is Status.FAILED}
    assert failed == {"e8", "e9", "e10"}
    for k in failed:
        assert got[k].error_class == "empty" and "asked 2 times" in got[k].last_error
        assert got[k].attempts == 2 and got[k].output is None
    assert got["e11"].status in (Status.DONE, Status.TRUNCATED)  # empty once, answered when asked again
    assert got["e11"].output["messages"][-1]["content"].strip()

    out = tmp_path / "export.jsonl"
    proc = harvest("export", str(tmp_path / "run"), "--format", "sharegpt", "--status", "done",
                   "--status", "truncated", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(exported) == 9
    assert "[empty]" not in out.read_text() and "[blank]" not in out.read_text()

    # The server is fixed (no output setting changed): --retry failed regenerates exactly those.
    write_job(job, data, [])
    proc = harvest("run", str(job), "--no-live", "--retry", "failed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--retry failed: 3 items back to pending" in proc.stderr
    after = rows(tmp_path / "run")
    assert len(after) == 12 and {r.status for r in after.values()} <= {Status.DONE, Status.TRUNCATED}
    for k in failed:
        assert after[k].output["messages"][-1]["content"].strip() and after[k].last_error is None
    for k in set(got) - failed:  # the others were not generated again
        assert after[k].output == got[k].output and after[k].created_at == got[k].created_at
    ledger = Ledger.open_readonly(tmp_path / "run")
    try:
        totals = ledger.check_totals()
        results = ledger.conn.execute("SELECT COUNT(*), COUNT(DISTINCT item) FROM results").fetchone()
        meta = ledger.meta()
    finally:
        ledger.close()
    assert totals.ok and results == (12, 12)
    (event,) = meta["requeues"]
    assert event["what"] == "failed" and event["count"] == 3 and "--retry failed" in event["reason"]
    # the retried items ran with the run's settings, and say so
    assert {after[k].settings_hash for k in failed} == {event["settings_hash"]} == {meta["settings_hash"]}


def test_retry_with_changed_output_settings_is_refused(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"x{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(["Fine?", "Nothing [empty]"])))
    job = write_job(tmp_path / "job.toml", data, ["--empty-answers"])
    assert harvest("run", str(job), "--no-live").returncode == 0
    write_job(job, data, [], max_tokens=12)  # max_tokens changes what the model writes
    proc = harvest("run", str(job), "--no-live", "--retry", "failed")
    assert proc.returncode == 2 and "settings" in proc.stderr, proc.stderr
    assert rows(tmp_path / "run")["x1"].status is Status.FAILED  # nothing was put back
    proc = harvest("run", str(job), "--no-live", "--retry", "done")
    assert proc.returncode == 2 and "--retry" in proc.stderr


@pytest.mark.engine
def test_a_wrong_model_name_on_vllm_is_refused_before_any_request(tmp_path, vllm_server):
    """A job naming a model vLLM does not serve: harvest asks vLLM's /v1/models when the run
    starts and refuses, naming the field and what vLLM serves, before one request is sent (it used
    to take the breaker's window of HTTP 404s: "The model `tyni` does not exist.")."""
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"v{i}", "prompt": f"Question {i}?"}) + "\n"
                            for i in range(40)))

    def write(model: str) -> Path:
        job = tmp_path / "job.toml"
        job.write_text(f"""
[server]
engine = "openai"
base_url = "{vllm_server.url}/v1"
served_model_name = {json.dumps(model)}

[data]
path = {json.dumps(str(data))}
id_field = "id"

[sampling]
max_tokens = 8

[client]
concurrency = 4
max_retries = 0
health_deadline = 60

[run]
breaker_window = 6

[output]
dir = {json.dumps(str(tmp_path / "run"))}
""")
        return job

    proc = harvest("run", str(write("tyni")), "--no-live")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"[server] served_model_name: 'tyni' is not served by {vllm_server.url}; it serves " \
           f"{vllm_server.model!r}" in proc.stderr, proc.stderr  # what to change, and to what
    got = rows(tmp_path / "run")
    assert len(got) == 40 and {r.status for r in got.values()} == {Status.PENDING}
    assert all(r.attempts == 0 for r in got.values())

    # The model name is an output setting; nothing was generated under the wrong one, so the fixed
    # job takes the folder, naming what changed, and finishes.
    fixed = write(vllm_server.model)
    proc = harvest("run", str(fixed), "--no-live")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "held no results (an earlier attempt left 40 pending): it takes this job's settings" in proc.stderr
    assert f'[server] model: "tyni" -> "{vllm_server.model}"' in proc.stderr, proc.stderr
    got = rows(tmp_path / "run")
    assert {r.status for r in got.values()} <= {Status.DONE, Status.TRUNCATED} and len(got) == 40
