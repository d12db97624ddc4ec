"""An OpenAI batch input file through `harvest run` and `harvest export --format openai-batch`,
against a small OpenAI-style endpoint of this test (a thread on 127.0.0.1) that answers what each
request asked: the rows that cannot run are skipped with their line and reason, every other row is
sent once with its own body over the job's [sampling], and the export has one line per input line,
in input order, in the documented schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from harvest import api
from harvest.campaign.run.intake import check_batch_sampling
from harvest.config import parse_config
from harvest.errors import ConfigError
from harvest.ledger import Ledger
from tests.campaign.loopback import LoopbackServer
from tests.campaign.test_export import documented
from tests.dataset.test_batch import ROWS, own_id
from tests.gpu.schema_doc import problems
from tests.realparts import require


class Echo(LoopbackServer):
    """Answers chat and text completions with ``n`` choices of ``max_tokens`` words each (cut at
    max_tokens: finish_reason "length"), log-probabilities where asked; keeps every body."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append({"path": request.path, **body})
        chat = request.path.endswith("/chat/completions")
        tokens = body.get("max_tokens", 16)
        choices = []
        for i in range(body.get("n", 1)):
            text = " ".join(f"w{i}" for _ in range(tokens))
            lp = None
            if chat and body.get("logprobs"):
                lp = {"content": [{"token": f"w{i}", "logprob": -0.5, "bytes": None,
                                   "top_logprobs": [{"token": "w", "logprob": -0.5, "bytes": None}]
                                   * body.get("top_logprobs", 0)}] * tokens}
            elif not chat and body.get("logprobs") is not None:
                lp = {"tokens": [f"w{i}"] * tokens, "token_logprobs": [-0.5] * tokens, "text_offset": [0] * tokens,
                      "top_logprobs": [{"w": -0.5}] * tokens}
            choice: dict[str, Any] = {"index": i, "finish_reason": "length", "logprobs": lp}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            choices.append(choice)
        n = len(choices)
        return web.json_response({"id": "x", "object": "chat.completion" if chat else "text_completion",
                                  "created": 0, "model": "served", "choices": choices,
                                  "usage": {"prompt_tokens": 3, "completion_tokens": tokens * n,
                                            "total_tokens": 3 + tokens * n}})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "served", "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app


def _job(tmp_path: Path, port: int) -> Path:
    data = tmp_path / "requests.jsonl"
    data.write_text("\n".join(text for text, _ in ROWS) + "\n")
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:{port}"\nmodel = "served"\n'
                   f'[data]\npath = "{data}"\nmax_skipped_share = 1.0\n'
                   f'[sampling]\nmax_tokens = 6\ntemperature = 0.25\ntop_p = 0.9\n'
                   f'[client]\nconcurrency = 4\nhealth_deadline = 10\n'
                   f'[output]\ndir = "{tmp_path / "run"}"\n')
    return job


def test_rows_run_with_their_own_bodies_and_the_export_has_a_line_per_input_line(tmp_path):
    with Echo() as echo:
        result = api.run(_job(tmp_path, echo.port))
    run_dir = tmp_path / "run"
    assert result.ok, result
    good = [json.loads(text) for text, reason in ROWS if reason is None]
    ledger = Ledger.open_readonly(run_dir)
    try:
        counts = {s.value: n for s, n in ledger.counts().items() if n}
    finally:
        ledger.close()
    assert counts == {"truncated": len(good), "skipped": len(ROWS) - len(good)}  # nothing else lost
    # Each row sent once, its body over the job's [sampling]: the row wins field by field.
    sent = {(b.get("messages") or [{}])[-1].get("content") or b.get("prompt"): b for b in echo.bodies}
    assert len(echo.bodies) == len(good) == len(sent)
    c1, t1, c2 = sent["q c1"], sent["p t1"], sent["q c2"]
    assert c1["path"] == "/v1/chat/completions" and c1["model"] == "served"
    assert (c1["max_tokens"], c1["n"], c1["temperature"], c1["top_p"], c1["logprobs"], c1["top_logprobs"]) == \
        (5, 2, 0.5, 0.9, True, 2)
    assert t1["path"] == "/v1/completions" and (t1["max_tokens"], t1["temperature"], t1["logprobs"], t1["seed"],
                                                  t1["stop"]) == (3, 0.25, 1, 7, ["\n"])
    assert (c2["max_tokens"], c2["top_p"], c2["temperature"]) == (4, 0.5, 0.25)
    assert "max_completion_tokens" not in c2 and "n" not in c2

    report = api.export(run_dir, "openai-batch")  # default: every item that ended
    lines = [json.loads(x) for x in report.path.read_text().splitlines()]
    assert len(lines) == len(ROWS)  # one line per input line, in input order
    # Every line echoes its input line's custom_id, skipped ones included; only a line without a
    # readable one (not JSON, not a string) gets the ledger's skip:<file>:<line>.
    expected = [own_id(text) if own_id(text) is not None else f"skip:requests.jsonl:{n}"
                for n, (text, _) in enumerate(ROWS, 1)]
    assert [x["custom_id"] for x in lines] == expected
    assert [n for n, x in enumerate(lines, 1) if x["custom_id"].startswith("skip:requests")] == [11, 12, 18, 19]
    assert len({x["id"] for x in lines}) == len(lines)  # a repeated custom_id: its lines told apart by id
    # Parquet joins each row to its input line by the line's own id (input_id), as the batch output
    # does by custom_id; a line without a readable one has none there (id stays the ledger's).
    require("pyarrow", "the parquet export is written and read back with pyarrow")
    import pyarrow.parquet as pq

    parquet = api.export(run_dir, "parquet", statuses="done,truncated,failed,skipped")
    table = pq.read_table(str(parquet.path)).to_pylist()
    joined = {(r["source_line"], r["input_id"]) for r in table}
    assert joined == {(n, own_id(text)) for n, (text, _) in enumerate(ROWS, 1)}, sorted(joined, key=str)
    assert {r["id"] for r in table if r["input_id"] is None} == {f"skip:requests.jsonl:{n}" for n in (11, 12, 18, 19)}
    first, repeat = (x for x in lines if x["custom_id"] == "c1")
    assert first["error"] is None and repeat["response"] is None
    assert "custom_id repeats an earlier line" in repeat["error"]["message"] and "first at line 1" in \
        repeat["error"]["message"]
    schema = documented("harvest.export.openai-batch/1")
    assert [p for x in lines for p in problems(x, schema)] == []
    for x, (_, reason) in zip(lines, ROWS):
        if reason is not None:
            assert x["response"] is None and x["error"]["code"] == "input" and reason in x["error"]["message"]
    by_id = {x["custom_id"]: x["response"]["body"] for x in lines if x["response"]}
    chat = by_id["c1"]
    assert chat["object"] == "chat.completion" and [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["choices"][1]["message"]["content"] == " ".join(["w1"] * 5)
    assert all(len(c["logprobs"]["content"]) == 5 for c in chat["choices"])
    assert chat["usage"] == {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}
    text = by_id["t1"]
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "w0 w0 w0"
    assert text["choices"][0]["logprobs"]["token_logprobs"] == [-0.5] * 3
    assert by_id["c2"]["choices"][0]["logprobs"] is None


def test_the_jobs_own_n_and_logprobs_are_refused_for_a_batch_file(tmp_path):
    data = tmp_path / "requests.jsonl"
    data.write_text("\n".join(text for text, _ in ROWS) + "\n")
    config = parse_config({"data": {"path": str(data)}, "sampling": {"n": 4, "logprobs": 2}}, "job.toml")
    with pytest.raises(ConfigError) as caught:
        check_batch_sampling(config)
    where = [w for w, _ in caught.value.problems]
    assert where == ["job.toml [sampling] n", "job.toml [sampling] logprobs"]
    assert "set n in the rows' bodies" in str(caught.value)
    check_batch_sampling(parse_config({"data": {"path": str(data)}}, "job.toml"))  # unset: runs
