"""``harvest run`` (a subprocess, as a user runs it) against endpoints that answer /health and
/v1/models well and completions badly (``bench/hostile_server.py`` on a thread of the test): each
run ends as the job deserves (finished with odd answers stored safely, or stopped early with the
items pending and exit 1, naming what the endpoint did), never with a traceback or a ledger error,
and the key in ``base_url``'s query is in no output and no file of the run folder, on every exit."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.hostile_server import completion, serve_in_thread
from tests import harvest_process

pytestmark = pytest.mark.slow  # several harvest runs, a few seconds each

MAX_TOKENS = 16
KEY = "sk-" + secrets.token_hex(12)


def run_job(tmp_path: Path, url: str, prompts: list[str], *, name: str, extra: str = "", run: str = "",
            key: str = KEY, start_deadline: float = 3) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``harvest run`` of one job over ``prompts`` against ``url`` (its key in the query)."""
    folder = tmp_path / name
    folder.mkdir()
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    run_dir = folder / "run"
    (folder / "job.toml").write_text(
        f'[server]\nengine = "openai"\nbase_url = "{url}/v1?api_key={key}"\nmodel = "hostile-model"\n'
        f'[data]\npath = "{data}"\n[sampling]\nmax_tokens = {MAX_TOKENS}\n'
        f'[client]\nconcurrency = 4\nmax_retries = 1\nstart_deadline = {start_deadline:g}\n{extra}'
        f'[run]\nprogress_interval = 0.2\n{run}[output]\ndir = "{run_dir}"\n')
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    done = harvest_process.run([sys.executable, "-m", "harvest", "run", "job.toml", "--no-live"], cwd=folder, env=env,
                               capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr, done.stderr
    assert_key_nowhere(done, folder)
    return done, run_dir


def assert_key_nowhere(done: subprocess.CompletedProcess[str], folder: Path) -> None:
    """The key is in no output and no file under ``folder`` (the ledger's pages and WAL included)."""
    assert KEY not in done.stdout and KEY not in done.stderr, (done.stdout, done.stderr)
    holding = [str(p) for p in folder.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert holding == [] or holding == [str(folder / "job.toml")], holding


def ledger(run_dir: Path) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        counts = dict(conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())
        classes = dict(conn.execute("SELECT error_class, COUNT(*) FROM items WHERE status = 'failed' GROUP BY 1"))
        outputs = {row[0]: json.loads(row[1]) for row in conn.execute(
            "SELECT i.id, r.output FROM items AS i JOIN results AS r ON r.item = i.seq")}
        return {"counts": counts, "classes": classes, "outputs": outputs}
    finally:
        conn.close()


def test_odd_answers_are_stored_safely_and_an_answer_at_max_tokens_without_a_reason_is_truncated(tmp_path):
    def body(**kw: Any) -> bytes:
        doc = json.loads(completion())
        choice, usage = doc["choices"][0], doc["usage"]
        for key, value in kw.items():
            (usage if key.endswith("tokens") else choice if key == "finish_reason" else choice["message"])[key] = value
        return json.dumps(doc, allow_nan=True).encode()

    answers = {
        "parts": body(content=[{"type": "text", "text": "from "}, {"type": "text", "text": "parts"}]),
        "reason-dict": body(finish_reason={}),
        "huge-count": body(completion_tokens=10**30, prompt_tokens=10**30),
        "abc-count": body(completion_tokens="abc"),
        "float-count": body(completion_tokens=1e308, prompt_tokens=1e308),
        "nan-count": body(completion_tokens=float("nan")),
        "negative-count": body(completion_tokens=-35_842, prompt_tokens=-1),
        "no-reason-at-max": body(finish_reason=None, completion_tokens=MAX_TOKENS),
        "surrogate": body().replace(b'"hello there"', b'"bad \\ud800 text"'),
    }
    with serve_in_thread("answer", answers=answers) as server:
        done, run_dir = run_job(tmp_path, server.url, list(answers), name="odd")
        status = harvest_process.run([sys.executable, "-m", "harvest", "status", str(run_dir)], capture_output=True,
                                     text=True, timeout=60,
                                     env={**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 0, done.stdout + done.stderr
    found = ledger(run_dir)
    assert found["counts"] == {"done": len(answers) - 1, "truncated": 1}, found["counts"]
    by_prompt = {list(answers)[int(i)]: out for i, out in found["outputs"].items()}
    assert by_prompt["parts"]["messages"][-1]["content"] == "from parts"
    turn = by_prompt["no-reason-at-max"]["turns"][0]
    assert (turn["finish_reason"], turn["finish_reason_sent"], turn["completion_tokens"]) == ("length", "", MAX_TOKENS)
    assert by_prompt["reason-dict"]["turns"][0]["finish_reason_sent"] == "{}"
    for prompt in ("huge-count", "abc-count", "float-count", "nan-count", "negative-count"):
        assert by_prompt[prompt]["turns"][0]["completion_tokens"] is None, prompt
    surrogate = by_prompt["surrogate"]
    assert surrogate["messages"][-1]["content"] == "bad \ufffd text" and surrogate["turns"][0]["replaced_chars"] == 1
    assert status.returncode == 0, status.stderr
    assert KEY not in status.stdout + status.stderr
    rate = next(line for line in status.stdout.splitlines() if "tok/s" in line)
    assert "inf" not in rate and "nan" not in rate and " -" not in rate.replace(" - ", " "), rate


@pytest.mark.parametrize("case, said", [("redirect", "307"), ("status_405", "405")])
def test_a_redirect_or_a_4xx_for_every_request_stops_the_run_early_with_the_items_pending(tmp_path, case, said):
    with serve_in_thread(case) as server:
        done, run_dir = run_job(tmp_path, server.url, [f"question {i}" for i in range(60)], name=case)
        sent = server.requests
    assert done.returncode == 1, done.stdout + done.stderr
    found = ledger(run_dir)
    assert found["counts"].get("pending") == 60 and "failed" not in found["counts"], found
    assert f"HTTP {said}" in done.stderr and "STOPPED" in done.stderr, done.stderr
    if case == "redirect":
        assert server.location and server.location in done.stderr and "base_url" in done.stderr
        assert sent <= 8  # the first answers stop it (concurrency 4, a claim or two in flight)
    else:
        assert sent <= 40  # 20 in a row, and what was in flight


def test_an_answer_wrong_every_time_stops_the_run_naming_its_class(tmp_path):
    with serve_in_thread("gzip_bomb", size=16 << 20) as server:
        done, run_dir = run_job(tmp_path, server.url, [f"question {i}" for i in range(12)], name="bomb",
                                extra="reply_bytes_per_token = 16\n", run="breaker_window = 6\n")
    assert done.returncode == 1, done.stdout + done.stderr
    found = ledger(run_dir)
    assert found["counts"].get("pending") == 12, found
    assert "6 requests in a row failed the same way (oversized)" in done.stderr, done.stderr
    assert "(oversized)" in done.stderr and "reply_bytes_per_token" in done.stderr, done.stderr


def test_a_wrong_port_stops_at_once_naming_what_answered_there(tmp_path):
    # The run stops at the first answer read (the banner), so a long start_deadline costs nothing
    # here; 3 s was not enough for one probe to be answered on a loaded machine (the suite on 2 cores).
    with serve_in_thread("banner") as server:
        done, run_dir = run_job(tmp_path, server.url, ["a", "b", "c"], name="banner", start_deadline=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SSH-2.0-OpenSSH" in done.stdout + done.stderr and "not an OpenAI-compatible server" in done.stdout
    assert ledger(run_dir)["counts"] == {"pending": 3}


def test_the_key_is_nowhere_when_the_endpoint_is_down(tmp_path):
    with serve_in_thread("ok") as server:
        url = server.url  # stopped: nothing listens there any more
    done, run_dir = run_job(tmp_path, url, ["a", "b"], name="down")
    assert done.returncode == 1 and "start_deadline" in done.stdout + done.stderr, done.stdout + done.stderr
    assert ledger(run_dir)["counts"] == {"pending": 2}


def test_more_failed_than_max_failed_share_exits_1_saying_so(tmp_path):
    # Empty answers fail each item ("empty"), no streak the breaker holds: the run finishes, and
    # the share of failed items is what fails it.
    with serve_in_thread("answer", answer=completion(text="")) as server:
        done, run_dir = run_job(tmp_path, server.url, [f"q{i}" for i in range(6)], name="empty",
                                extra="", run="max_failed_share = 0.5\n")
    assert done.returncode == 1, done.stdout + done.stderr
    assert ledger(run_dir)["counts"] == {"failed": 6}
    assert "FAILED: 6 of 6 items failed (100%, more than [run] max_failed_share 50%)" in done.stderr
    assert "--retry failed" in done.stderr
