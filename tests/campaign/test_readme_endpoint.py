"""docs/endpoints.md's "An endpoint that is already running" section runs as written: its job file is
written as given, with only the `base_url` line pointed at a running endpoint (bench/sim_engine.py,
serving the model name the guide asks for), the dataset it describes is written beside it, and
every `harvest` command of its shell block must succeed. Then the same job without its
`prompt_field` line shows the section's other promise: every row skipped, exit 1, the reason."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from tests import harvest_process

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "endpoints.md"
SIM_ENGINE = Path(__file__).resolve().parents[2] / "bench" / "sim_engine.py"
TITLE = "An endpoint that is already running"


def section() -> tuple[str, list[str]]:
    text = GUIDE.read_text()
    start = text.index(f"## {TITLE}\n")
    body = text[start:text.find("\n## ", start + 1)]
    (toml,) = re.findall(r"```toml\n(.*?)```", body, re.S)
    commands = [ln.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", body, re.S)
                for ln in block.splitlines() if ln.strip().startswith("harvest ")]
    return toml, commands


def test_the_readme_endpoint_job_runs_as_written(tmp_path):
    toml, commands = section()
    model = re.search(r'^model = "([^"]+)"', toml, re.M).group(1)  # type: ignore[union-attr]
    sim = subprocess.Popen([sys.executable, str(SIM_ENGINE), "--port", "0", "--token-latency", "0.01",
                            "--max-batch", "16", "--output-tokens", "5", "--model", model],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        m = re.search(r"listening on ([\d.]+):(\d+)", sim.stdout.readline())  # type: ignore[union-attr]
        assert m, "the simulated engine did not start"
        job = re.sub(r'^base_url = "[^"]*"', f'base_url = "http://{m.group(1)}:{m.group(2)}/v1"', toml, flags=re.M)
        assert job.count("\n") == toml.count("\n") and job != toml
        (tmp_path / "job.toml").write_text(job)
        (tmp_path / "questions.jsonl").write_text(
            "".join(json.dumps({"qid": i, "question": f"What is {i} squared?"}) + "\n" for i in range(30)))
        assert commands and commands[0] == "harvest run job.toml", commands
        for command in commands:
            res = harvest_process.run([sys.executable, "-m", "harvest.cli.main", *shlex.split(command)[1:]],
                                      cwd=tmp_path, capture_output=True, text=True, timeout=300,
                                      stdin=subprocess.DEVNULL)
            assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        status = harvest_process.run([sys.executable, "-m", "harvest.cli.main", "status", "job.toml", "--json"],
                                     cwd=tmp_path, capture_output=True, text=True, timeout=60)
        doc = json.loads(status.stdout)
        assert doc["counts"]["done"] == 30 and doc["totals"]["ok"] and doc["model"] == model, doc["counts"]
        exported = tmp_path / "runs" / "questions" / "export.sharegpt.jsonl"
        assert len(exported.read_text().splitlines()) == 30

        # Without the prompt_field line: every row skipped, exit 1, the reason and its fix.
        (tmp_path / "job.toml").write_text(job.replace('prompt_field = "question"\n', "")
                                           .replace("runs/questions", "runs/unfixed"))
        res = harvest_process.run([sys.executable, "-m", "harvest.cli.main", "run", "job.toml"], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "every input row (30) was skipped" in res.stderr and "set prompt_field" in res.stdout + res.stderr
    finally:
        if sim.poll() is None:
            os.killpg(sim.pid, signal.SIGTERM)  # the engine this test started
            sim.wait(timeout=15)
