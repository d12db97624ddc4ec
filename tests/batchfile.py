"""An OpenAI batch input file of mixed requests, and the checks of its answers, shared by the
vLLM test (tests/campaign/test_batch_vllm.py) and the benchmark against `vllm run-batch`
(bench/batch_file.py).

Row ``i``: chat (``/v1/chat/completions``) unless ``i % 3 == 2`` (``/v1/completions``);
``max_tokens`` 1..6; greedy (temperature 0, n 1) for even ``i``, 0.8 with a seed and ``n`` 1, 2 or 3
for odd;
log-probabilities on every fourth row (chat: ``top_logprobs`` 2; completions: ``logprobs`` 2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
WORDS = ("river", "lamp", "orbit", "maple", "signal", "harbor", "copper", "meadow")


def batch_row(i: int, model: str, *, chat_only: bool = False, seeded: bool = True) -> dict[str, Any]:
    chat = chat_only or i % 3 != 2
    greedy = i % 2 == 0
    # vLLM refuses n > 1 at temperature 0 ("n must be 1 when using greedy sampling"): n on sampled rows
    body: dict[str, Any] = {"model": model, "max_tokens": 1 + i % 6, "temperature": 0.0 if greedy else 0.8,
                            "n": 1 if greedy else (1, 2, 3)[(i // 2) % 3]}
    if not greedy and seeded:
        body["seed"] = i
    text = f"Row {i}: write about the {WORDS[i % len(WORDS)]} and the number {i * 7 % 101}."
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        if i % 4 == 0:
            body.update(logprobs=True, top_logprobs=2)
    else:
        body["prompt"] = text
        if i % 4 == 0:
            body["logprobs"] = 2
    return {"custom_id": f"row-{i:04d}", "method": "POST", "url": CHAT if chat else TEXT, "body": body}


def write_batch(path: Path, rows: int, model: str, *, chat_only: bool = False,
                seeded: bool = True) -> list[dict[str, Any]]:
    lines = [batch_row(i, model, chat_only=chat_only, seeded=seeded) for i in range(rows)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return lines


def choice_tokens(choice: Mapping[str, Any]) -> int | None:
    """A choice's generated tokens by its own log-probabilities (None without them)."""
    lp = choice.get("logprobs")
    if not lp:
        return None
    return len(lp["content"]) if "content" in lp else len(lp["tokens"])


def answer_problems(request: Mapping[str, Any], line: Mapping[str, Any]) -> list[str]:
    """Every way an output line does not honour its request's body: the line's custom_id, ``n``
    choices, no choice past ``max_tokens`` (exactly at it when cut by length), log-probabilities
    where asked (``top_logprobs`` / ``logprobs`` alternatives per token) and none where not."""
    body, cid = request["body"], request["custom_id"]
    out: list[str] = []
    if line.get("custom_id") != cid or line.get("error") is not None or not line.get("response"):
        return [f"{cid}: not answered: {line.get('error')!r}"]
    answer = line["response"]["body"]
    choices = answer["choices"]
    n, limit = body.get("n", 1), body["max_tokens"]
    if len(choices) != n:
        out.append(f"{cid}: {len(choices)} choices, asked n = {n}")
    asked = body.get("top_logprobs") if request["url"] == CHAT and body.get("logprobs") else body.get("logprobs") \
        if request["url"] == TEXT else None
    for c in choices:
        tokens = choice_tokens(c)
        if asked is None:
            if c.get("logprobs") is not None:
                out.append(f"{cid}: logprobs not asked but sent")
            continue
        if tokens is None:
            out.append(f"{cid}: logprobs asked ({asked}) but none sent")
            continue
        if tokens > limit or (c["finish_reason"] == "length" and tokens != limit):
            out.append(f"{cid}: {tokens} tokens, max_tokens {limit}, finish_reason {c['finish_reason']}")
        tops = [len(t["top_logprobs"]) for t in c["logprobs"]["content"]] if request["url"] == CHAT else \
            [len(t) for t in c["logprobs"]["top_logprobs"]]
        if any(k < asked for k in tops):
            out.append(f"{cid}: fewer than {asked} alternatives per token: {tops}")
    used = answer["usage"]["completion_tokens"]
    if used > n * limit or (all(c["finish_reason"] == "length" for c in choices) and used != n * limit):
        out.append(f"{cid}: usage {used} completion tokens for n = {n} x max_tokens {limit}")
    return out


def answers(lines: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    """custom_id -> the text of each choice (chat message content or completion text)."""
    out = {}
    for x in lines:
        if x.get("response") and x["response"].get("body"):
            out[x["custom_id"]] = [c["message"]["content"] if "message" in c else c["text"]
                                   for c in x["response"]["body"]["choices"]]
    return out
