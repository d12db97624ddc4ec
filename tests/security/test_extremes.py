"""Extreme values end in one clear line; id conflicts and terminal controls in data are shown as such.

``concurrency = 9223372036854775807`` and a ``model`` path with a 300-byte name used to end in
tracebacks (SQLite's integer overflow, the file system's ENAMETOOLONG). Ids ``1`` and ``"1"``
with different prompts were counted as one duplicate with no word about the conflict; an id
holding an escape sequence reached the terminal raw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import engines, harvest_process

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"


def harvest(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


@pytest.mark.parametrize(("table", "where"), [
    ('[client]\nconcurrency = 9223372036854775807\nendpoints = ["http://127.0.0.1:9"]\n', "[client] concurrency"),
    ('[server]\nengine = "vllm"\nmodel = "/models/' + "m" * 300 + '"\n', "[server] model"),
    ('[client]\nendpoints = ["http://127.0.0.1:9"]\n[data]\nlimit = 18446744073709551615\n', None),
])
def test_extreme_values_end_in_one_clear_line(tmp_path, env, table, where):
    data = tmp_path / "in.jsonl"
    data.write_text('{"id": "a", "prompt": "x"}\n')
    job = tmp_path / "job.toml"
    path_line = f'path = "{data}"\n'
    job.write_text(table.replace("[data]\n", "[data]\n" + path_line) if "[data]" in table
                   else table + "[data]\n" + path_line)
    done = harvest(env, "run", str(job), "--no-live")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith("error: invalid configuration"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 2, done.stderr  # the file, then the one problem
    if where:
        assert f"job.toml {where}:" in done.stderr, done.stderr
    assert not (tmp_path / "harvest-run").exists()


def test_id_conflicts_are_named_in_the_input_line_status_and_report_and_controls_are_escaped(tmp_path, env):
    evil = "e\x1b]0;owned\x07\x1b[2J"
    rows = [{"id": 1, "prompt": "first one"}, {"id": "1", "prompt": "another prompt"},  # a conflict
            {"id": "2", "prompt": "two"}, {"id": "2", "prompt": "two"},                  # a plain duplicate
            {"id": evil, "prompt": "p"}, {"id": evil, "prompt": "q"}]                    # a conflict
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "command"\nport = {engines.free_port()}\nready_timeout = 30\n'
                   f'stop_grace = 2\nstop_deadline = 6\nhealth_url = "http://{{host}}:{{port}}/health"\n'
                   f'command = ["{sys.executable}", "{CHAT_ENGINE}", "--host", "{{host}}", "--port", "{{port}}"]\n'
                   f'[preflight]\nmin_disk_free_gib = 0.05\n[data]\npath = "{data}"\nid_field = "id"\n'
                   f'[sampling]\nmax_tokens = 4\n[output]\ndir = "{run_dir}"\n')
    run = harvest(env, "run", str(job), "--no-live")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout + run.stderr
    assert "6 rows, 3 unique, 3 duplicates (2 of them id conflicts: same id, different content; the first row " \
           "with the id is kept: '1', 'e\\x1b]0;owned\\x07\\x1b[2J')" in out, out
    assert "\x1b" not in out and "\x07" not in out

    status = harvest(env, "status", str(run_dir))
    assert "(2 id conflicts: same id, different content)" in status.stdout, status.stdout
    assert "id conflict: same id, different content" in status.stdout
    doc = json.loads(harvest(env, "status", str(run_dir), "--json").stdout)
    assert doc["totals"]["id_conflicts"] == 2 and doc["totals"]["duplicates"] == 3, doc["totals"]
    report = harvest(env, "report", str(run_dir))
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report.html").read_text()
    assert "id conflicts (same id, different content)" in page and 'data-json="totals.id_conflicts">2<' in page
