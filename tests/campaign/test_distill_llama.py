"""Samples on llama-server: by default one request per sample (distinct seeds: older builds refuse
``n != 1``), or one request with ``n`` for a build that takes it; logprobs stored by the token ids
llama-server sends."""

from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from harvest.ledger import Ledger
from tests import harvest_process

pytestmark = [pytest.mark.engine]


def test_this_llama_server_build_answers_n_with_n_choices(llama_server):
    """What the pinned build does with ``n`` (older builds answered HTTP 500 "Only one completion
    choice is allowed"): n choices, each with token ids in its logprobs."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2, "logprobs": True,
            "top_logprobs": 2}
    req = urllib.request.Request(f"{llama_server.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    choices = json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(isinstance(t["id"], int) for c in choices for t in c["logprobs"]["content"])


@pytest.mark.parametrize("per_request", [None, True])
def test_samples_on_llama_server(tmp_path, llama_server, per_request):
    rows = [{"id": f"l{i}", "prompt": f"Count to {i}."} for i in range(5)]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    choice = "" if per_request is None else f"n_per_request = {str(per_request).lower()}\n"
    job.write_text(
        f'[data]\npath = "{data}"\nid_field = "id"\n'
        f'[sampling]\nmax_tokens = 8\ntemperature = 1.0\nseed = 11\nn = 3\nlogprobs = 2\n{choice}'
        f'[client]\nendpoints = ["{llama_server.url}"]\nconcurrency = 4\nhealth_deadline = 60\n'
        f'[output]\ndir = "{run_dir}"\n')
    done = harvest_process.run([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], capture_output=True,
                               text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    said = "3 separate requests with seeds 11..13" if per_request is None else "one request with n = 3"
    assert said in done.stdout + done.stderr
    with Ledger.open_readonly(run_dir) as ledger:
        results = list(ledger.iter_results(("done", "truncated")))
        assert sorted((r.item_id, r.sample) for r in results) == sorted(
            (f"l{i}", s) for i in range(5) for s in range(3))
        for r in results:
            turns = ledger.logprobs(r)
            # llama-server may send fewer logprob entries than usage counts (seen: 7 for 8 tokens)
            assert turns is not None and turns[0].k == 2 and 0 < len(turns[0]) <= r.completion_tokens
            assert (turns[0].token_ids >= 0).all()
        texts: dict[str, set[str]] = {}
        for r in results:
            texts.setdefault(r.item_id, set()).add(r.output["messages"][-1]["content"])
        assert sum(len(t) == 3 for t in texts.values()) >= 4, texts  # distinct samples
