"""Secrets given to harvest, followed to every place it writes or shows a value it was given.

One real campaign on llama-server, reached under two URL spellings (two endpoints, so the live
panel draws a row per endpoint), with a token in each place a job can hold one: the user part and
the password of a URL, credential-named query keys, and header-like keys and values in
``[sampling] extra_body`` (``authorization = "Bearer ..."``, ``x-api-key``, ``cookie``, a note
holding ``Authorization: Basic ...``). ``harvest run`` draws its panel in a real terminal (tmux);
then each token is searched in every file of the run folder and the state dir, in a dump of the
ledger (``iterdump``: the meta, the results), in ``status``, ``status --json``, the report page and
every captured screen. The settings hash still tells two secrets apart: a resume with another
``authorization`` is refused, naming the change without either value.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from tests.cli.terminal import Terminal
from tests.security.test_secret_paths import assert_nowhere, env, harvest  # noqa: F401

# llama-server (the shared fixture) under two URL spellings, and a real terminal (tmux).
pytestmark = pytest.mark.engine


def ledger_dump(run_dir: Path) -> str:
    """Every row of the ledger as SQL (the meta, the items, the results)."""
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


def meta(run_dir: Path, key: str) -> dict:
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return json.loads(conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])
    finally:
        conn.close()


def job_text(port: int, tokens: dict[str, str], run_dir: Path, data: Path) -> str:
    t = tokens
    return f"""
[server]
engine = "openai"
base_url = "http://user:{t['url_password']}@127.0.0.1:{port}/v1?api_key={t['query']}&token={t['query']}"

[client]
concurrency = 4
endpoints = ["http://{t['url_user']}@localhost:{port}/v1?access_token={t['query2']}"]

[data]
path = "{data}"
id_field = "id"

[sampling]
max_tokens = 24
top_k = 40
extra_body = {{authorization = "Bearer {t['bearer']}", "x-api-key" = "{t['header']}", cookie = "session={t['cookie']}", note = "Authorization: Basic {t['basic']}"}}

[run]
progress_interval = 0.3

[output]
dir = "{run_dir}"
"""


def test_secrets_in_urls_headers_and_extra_body_are_shown_nowhere(tmp_path, env, llama_server):
    tokens = {name: f"tk{name[:3]}-" + secrets.token_hex(10) for name in
              ("url_password", "url_user", "query", "query2", "bearer", "header", "cookie", "basic")}
    n = 400
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Write about topic {i}."}) + "\n"
                            for i in range(n)))
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(job_text(llama_server.port, tokens, run_dir, data))

    term = Terminal(tmp_path / "screens")
    try:
        term.start([sys.executable, "-m", "harvest", "run", str(job)], env=env, cwd=tmp_path)
        end, status = time.monotonic() + 600, None
        while status is None and time.monotonic() < end:
            term.capture()
            status = term.exit_status()
            time.sleep(0.25)
        if status is None:  # out of time: Ctrl-C, as a person would
            term.send("C-c")
            time.sleep(10)
        screens = term.screens
    finally:
        term.stop()
    assert status == 0, f"harvest run exited {status}:\n{screens[-1].text}"
    # The panel drew a row per endpoint (two URL spellings), each with its secrets hidden.
    # ("waiting" may wrap onto the next line of the 80-column panel: the URL's line says "running")
    rows = {line.split()[1] for s in screens for line in s.text.splitlines()
            if "running" in line and "://" in line and line.startswith("│")}
    port = llama_server.port
    assert f"http://***@127.0.0.1:{port}?api_key=***&token=***" in rows, rows
    assert f"http://***@localhost:{port}?access_token=***" in rows, rows

    outputs = [st := harvest(env, "status", str(run_dir), "--json"), harvest(env, "status", str(run_dir)),
               rep := harvest(env, "report", str(run_dir))]
    assert all(o.returncode == 0 for o in outputs), [(o.args[3:], o.stdout, o.stderr) for o in outputs]
    assert json.loads(st.stdout)["totals"]["settled"] == n, st.stdout
    page = (run_dir / "report.html").read_text()
    dump = ledger_dump(run_dir)
    for name, token in tokens.items():
        assert token not in dump, name
        assert token not in page, name
        for s in screens:
            assert token not in s.text, (name, s.text)
        assert assert_nowhere(token, [run_dir, tmp_path / "state"], outputs) >= 5, name
    # Recorded as shown: the secrets as ***, every other setting as given.
    body = meta(run_dir, "job")["sampling"]["extra_body"]
    assert body == {"authorization": "***", "x-api-key": "***", "cookie": "***", "note": "Authorization: Basic ***"}
    settings = meta(run_dir, "output_settings")["sampling"]
    assert settings["extra_body"] == body and settings["top_k"] == 40 and settings["max_tokens"] == 24
    assert "Authorization: Basic ***" in page

    # Another secret is another job: refused, named without either value; the same job resumes.
    job.write_text(job_text(port, {**tokens, "bearer": "tkother-" + secrets.token_hex(10)}, run_dir, data))
    other = harvest(env, "run", str(job), "--no-live")
    assert other.returncode == 2, other.stdout + other.stderr
    assert "belongs to another job" in other.stderr and "a value shown as ***" in other.stderr, other.stderr
    job.write_text(job_text(port, tokens, run_dir, data))
    again = harvest(env, "run", str(job), "--no-live")
    assert again.returncode == 0 and "nothing left to do" in again.stdout + again.stderr, again.stdout + again.stderr
    for name, token in tokens.items():
        assert assert_nowhere(token, [run_dir, tmp_path / "state"], [other, again]) >= 5, name
    assert os.path.exists(run_dir / "ledger.sqlite")
