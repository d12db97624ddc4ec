"""An OpenAI batch file of 300 mixed rows on the shared vLLM CPU server: each row's answer honours
its own body (n choices, max_tokens, log-probabilities where asked), and a `harvest run` killed with
SIGKILL mid-run and resumed answers every custom_id exactly once. The export is parsed with the
OpenAI SDK's types (the `openai` package of vLLM's environment).

Why vLLM: ``n`` choices in one request and log-probabilities as vLLM returns them, for both chat and
text completions. The kill is SIGKILL of the `harvest run` this test started, by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import harvest_process
from tests.batchfile import answer_problems, write_batch
from tests.campaign.ledger_peek import orphan_results, result_ids, results_count
from tests.engines import served_model

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ROWS = 160

#: Run with vLLM's Python: every output line's body through the OpenAI SDK's response types.
SDK_CHECK = """
import json, sys
from openai.types import Completion
from openai.types.chat import ChatCompletion
n = 0
for raw in open(sys.argv[1]):
    line = json.loads(raw)
    body = line["response"]["body"]
    (ChatCompletion if body["object"] == "chat.completion" else Completion).model_validate(body)
    n += 1
print(n)
"""


def test_batch_rows_honour_their_bodies_killed_and_resumed_once(tmp_path, vllm_server, vllm_python):
    model = served_model(vllm_server.url)
    requests = write_batch(tmp_path / "requests.jsonl", ROWS, model)
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "openai"\nbase_url = "{vllm_server.url}"\nmodel = "{model}"\n'
                   f'[data]\npath = "{tmp_path / "requests.jsonl"}"\n'
                   f'[client]\nconcurrency = 32\nhealth_deadline = 60\n'
                   f'[output]\ndir = "{run_dir}"\n[run]\nprogress_interval = 0.5\n')
    argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    first = harvest_process.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 120
    while time.monotonic() < end and first.poll() is None and results_count(run_dir) < ROWS // 4:
        time.sleep(0.1)
    killed = first.poll() is None
    if killed:
        os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    before = results_count(run_dir)
    assert killed and 0 < before < ROWS, f"the kill did not land mid-run ({before} results)"

    final = harvest_process.run(argv, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stdout + final.stderr
    ids = result_ids(run_dir)
    assert sorted(ids) == sorted(r["custom_id"] for r in requests) and orphan_results(run_dir) == 0  # each once

    export = harvest_process.run([sys.executable, "-m", "harvest", "export", str(run_dir), "--format", "openai-batch"],
                                 capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stdout + export.stderr
    out = run_dir / "export.openai-batch.jsonl"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [r["custom_id"] for r in requests]  # one per input line, in order
    assert [p for r, x in zip(requests, lines) for p in answer_problems(r, x)] == []
    assert sum(len(x["response"]["body"]["choices"]) for x in lines) == sum(r["body"]["n"] for r in requests)
    sdk = subprocess.run([vllm_python, "-c", SDK_CHECK, str(out)], capture_output=True, text=True, timeout=120)
    assert sdk.returncode == 0 and sdk.stdout.strip() == str(ROWS), sdk.stderr[-3000:]
