"""A job from flags alone, and one setting changed for one run: ``harvest run --engine openai
--base-url URL --model M --data FILE --out DIR`` against a real llama-server finishes with no job
file, the same command again resumes (nothing sent twice), a changed output-affecting flag is
refused as a changed file is, and ``harvest run job.toml --set client.concurrency=3`` runs with 3.
A flag's mistake is named by the flag, with exit 2, before anything is created."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import harvest_process
from tests.engines import served_model

ROWS = 12


def harvest(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *argv], cwd=cwd, capture_output=True, text=True,
                               timeout=300, stdin=subprocess.DEVNULL)


def rows(folder: Path) -> Path:
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Count to {i}."}) + "\n" for i in range(ROWS)))
    return data


def status(run_dir: Path, cwd: Path) -> dict:
    out = harvest("status", str(run_dir), "--json", cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_job_from_flags_alone_finishes_and_the_same_command_resumes(tmp_path, llama_server):
    rows(tmp_path)
    flags = ["--engine", "openai", "--base-url", llama_server.url + "/v1", "--model", served_model(llama_server.url),
             "--data", "prompts.jsonl", "--out", "out", "--max-tokens", "8", "--concurrency", "4"]
    first = harvest("run", *flags, "--no-live", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    doc = status(tmp_path / "out", tmp_path)
    assert doc["counts"]["done"] + doc["counts"]["truncated"] == ROWS and doc["totals"]["ok"], doc
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["concurrency"] == 4

    again = harvest("run", *flags, "--no-live", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "this session: 0 items in" in again.stdout, again.stdout
    assert status(tmp_path / "out", tmp_path)["totals"]["results"] == ROWS  # nothing answered twice

    changed = harvest("run", *[("16" if f == "8" else f) for f in flags], "--no-live", cwd=tmp_path)
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "max_tokens" in changed.stderr, changed.stderr


def test_set_changes_one_setting_of_a_job_file(tmp_path, llama_server):
    rows(tmp_path)
    (tmp_path / "job.toml").write_text(
        "[server]\n"
        'engine = "openai"\n'
        f'base_url = "{llama_server.url}/v1"\n'
        f'model = "{served_model(llama_server.url)}"\n'
        "[data]\n"
        'path = "prompts.jsonl"\n'
        "[sampling]\n"
        "max_tokens = 8\n"
        "[client]\n"
        "concurrency = 8\n"
        "[output]\n"
        'dir = "run"\n')
    done = harvest("run", "job.toml", "--set", "client.concurrency=3", "--no-live", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["concurrency"] == 3
    assert status(tmp_path / "run", tmp_path)["totals"]["ok"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--set", "client.concurrency=0"], "--set client.concurrency ([client] concurrency): must be >= 1"),
    (["--set", "clent.concurrency=3"], "--set clent.concurrency ([clent]): unknown table (did you mean 'client'?)"),
    (["--set", "concurrency"], "--set concurrency: should be SECTION.KEY=VALUE"),
    (["--max-tokens", "0"], "--max-tokens ([sampling] max_tokens): Input should be greater than or equal to 1"),
    (["--engine", "vlm"], "--engine ([server] engine)"),
])
def test_a_flags_mistake_is_named_by_the_flag_before_anything_is_created(tmp_path, argv, says):
    (tmp_path / "job.toml").write_text('[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
                                       'model = "m"\n[data]\npath = "prompts.jsonl"\n[output]\ndir = "run"\n')
    rows(tmp_path)
    out = harvest("run", "job.toml", *argv, "--no-live", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


def test_no_job_and_no_flags_says_what_to_give(tmp_path):
    out = harvest("run", cwd=tmp_path)
    assert out.returncode == 2
    assert "give a job file (JOB.toml) or the job as flags" in out.stderr
