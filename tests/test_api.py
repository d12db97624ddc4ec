"""harvest from Python against a real llama-server: ``harvest.run('job.toml')`` in a fresh
interpreter (as the README shows it) returns the run folder and the counts by status; ``await
harvest.arun(...)`` from inside a running event loop (a notebook's) runs a job given as keywords,
and ``harvest.run`` there says to use ``arun``; ``status`` and ``export`` are the commands'
functions; a mistake is harvest's own exception type, never a SystemExit."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

import harvest
import harvest.api
from tests.engines import served_model

ROWS = 8


def write_data(folder: Path) -> Path:
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i}."}) + "\n" for i in range(ROWS)))
    return data


def test_run_from_a_fresh_interpreter_prints_the_folder_and_counts(tmp_path, llama_server):
    write_data(tmp_path)
    (tmp_path / "job.toml").write_text(
        f'[server]\nengine = "openai"\nbase_url = "{llama_server.url}/v1"\nmodel = "{served_model(llama_server.url)}"\n'
        '[data]\npath = "prompts.jsonl"\n[sampling]\nmax_tokens = 8\n[client]\nconcurrency = 4\n'
        '[output]\ndir = "run"\n')
    code = "import harvest; r = harvest.run('job.toml'); print(r.run_dir, r.counts)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    folder, counts = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert Path(folder) == tmp_path / "run"
    counts_doc = ast.literal_eval(counts)  # the printed dict of str -> int
    assert counts_doc["done"] + counts_doc["truncated"] == ROWS and counts_doc["pending"] == 0, counts_doc

    st = harvest.status(tmp_path / "run")
    assert st.totals.ok and st.settled == ROWS
    exported = harvest.export(tmp_path / "run", "sharegpt", statuses=("done", "truncated"),
                              output=tmp_path / "out.jsonl")
    assert exported.written == ROWS == len((tmp_path / "out.jsonl").read_text().splitlines())


def test_arun_inside_a_running_loop_with_the_job_as_keywords(tmp_path, llama_server):
    data = write_data(tmp_path)

    async def notebook_cell() -> harvest.api.RunResult:
        with pytest.raises(harvest.HarvestError, match=r"use `await harvest.arun\(...\)`"):
            harvest.run("job.toml")
        return await harvest.arun(engine="openai", base_url=llama_server.url + "/v1",
                                  model=served_model(llama_server.url), data=data, out=tmp_path / "nb",
                                  max_tokens=8, settings={"client.concurrency": 3})

    result = asyncio.run(notebook_cell())
    assert result.ok and result.outcome == "finished" and result.run_dir == tmp_path / "nb"
    assert result.counts["done"] + result.counts["truncated"] == ROWS
    assert json.loads((tmp_path / "nb" / "progress.json").read_text())["concurrency"] == 3


def test_mistakes_are_harvests_own_errors(tmp_path):
    with pytest.raises(harvest.ConfigError, match=r"settings\['client.concurency'\] \(\[client\] concurency\): "
                                                  r"unknown key \(did you mean 'concurrency'\?\)"):
        harvest.api.load_job(engine="openai", base_url="http://127.0.0.1:9/v1", model="m",
                             settings={"client.concurency": 3})
    with pytest.raises(harvest.ConfigError, match="unknown keyword"):
        harvest.api.load_job("job.toml", concurency=3)
    with pytest.raises(harvest.ConfigError, match="cannot read"):
        harvest.run(tmp_path / "missing.toml")
    # A job of keywords alone says so, and names the keyword to give or to fix, not a flag.
    with pytest.raises(harvest.ConfigError) as no_data:
        harvest.run(engine="openai", base_url="http://127.0.0.1:9/v1", model="m")
    assert str(no_data.value) == ("invalid configuration in harvest.run keywords:\n  harvest.run keywords [data]: "
                                  "harvest.run needs a dataset: give data=FILE"), str(no_data.value)
    with pytest.raises(harvest.ConfigError) as bad:
        harvest.run(engine="openai", base_url="http://127.0.0.1:9/v1", model="m", data="x.jsonl", concurrency=0)
    assert str(bad.value).startswith("invalid configuration in harvest.run keywords:\n  concurrency= ([client] "
                                     "concurrency): "), str(bad.value)
    with pytest.raises(harvest.LedgerError):
        harvest.status(tmp_path)
