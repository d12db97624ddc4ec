"""How a probe talks to each engine: tokenize a chat, generate greedily, score given tokens.

Three protocols, picked by engine (``[probe] protocol``):

``vllm``    ``POST /tokenize`` with ``messages`` (the server applies its chat template); greedy
            ``POST /v1/completions`` with the prompt as token ids and ``return_token_ids``
            (``choices[0].token_ids``); teacher forcing by ``prompt_logprobs: k`` on prompt +
            target ids with ``max_tokens: 1`` -- per position a dict ``{token_id: {logprob, rank,
            decoded_token}}`` holding the top-k and the actual token (checked on vLLM 0.32.0).
``sglang``  the chat template applied by the model's own tokenizer in the engine's Python (SGLang
            has no chat-aware tokenize endpoint); ``POST /generate`` with ``input_ids``; teacher
            forcing by ``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num``, read from
            ``meta_info.input_token_logprobs`` / ``input_top_logprobs`` (``[logprob, token_id,
            text]`` triples). Written from SGLang's documentation; not run here (no SGLang install).
``chat``    any OpenAI-compatible chat endpoint (llama.cpp, ``transformers serve``): greedy chat
            completions compared as text. No teacher forcing: such engines return no prompt
            logprobs, and reports say so.

Every request has a timeout. A 4xx raises :class:`RequestError` (this prompt), anything else that
fails raises :class:`ServerSick` (the server). Requests go through the client's transport
(:class:`harvest.aiohttp_transport.AiohttpTransport`, aiohttp: harvest's one HTTP library, see
:mod:`harvest.http`), never through an environment proxy. This module never launches or stops a server.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from harvest.client.endpoints import endpoint_url, normalize_url
from harvest.client.replies import BYTES_PER_TOKEN, limits_for
from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import Transport, TransportError
from harvest.config import ServerConfig
from harvest.errors import ConfigError, RequestError, ServerSick
from harvest.quality.probe import ProbePrompt
from harvest.redact import redact_text
from harvest.server.base import bearer_headers, python_of


@dataclass(frozen=True)
class Generation:
    """A greedy answer: its text, and its token ids where the engine reports them."""

    text: str
    token_ids: tuple[int, ...] | None
    finish_reason: str | None


@dataclass(frozen=True)
class TokenScore:
    """One given token scored by a server: its logprob, the top-k there, and the top-1."""

    token: int
    logprob: float
    top: dict[int, float]
    top1: int


class Wire:
    """Base of the protocols: one HTTP client, a concurrency bound, error mapping by status."""

    name = "base"
    #: True when :meth:`score` works (the engine returns prompt logprobs).
    teacher_forcing = False
    #: True when generations carry token ids (else they are compared as text).
    token_ids = False

    def __init__(self, config: ServerConfig, *, concurrency: int = 8, timeout: float = 300.0,
                 transport: Transport | None = None):
        """``transport`` replaces the aiohttp transport (a ``MockTransport`` in tests); it is closed
        with the wire."""
        self.config = config
        self.url = normalize_url(config.url)
        #: The URL as errors show it (a user part or a query key hidden).
        self.shown = redact_text(config.url)
        self.model = config.served_model_name or config.model
        self.timeout = timeout
        self._slots = asyncio.Semaphore(concurrency)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         **bearer_headers(config)}
        self._http = transport or AiohttpTransport(max_connections=concurrency + 2,
                                                   connect_timeout=min(10.0, timeout))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Wire:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST JSON, return the decoded answer. 4xx -> RequestError; other failures -> ServerSick."""
        async with self._slots:
            try:
                data = json.dumps(body).encode()
                cap = limits_for(body, BYTES_PER_TOKEN, len(data)).body_bytes  # the client's caps for the same request
                r = await self._http.request("POST", endpoint_url(self.url, path), body=data, headers=self._headers,
                                             timeout=self.timeout, max_bytes=cap)
            except (TransportError, aiohttp.ClientError) as exc:  # ClientError: an answer that is not HTTP
                raise ServerSick(f"POST {path}: {type(exc).__name__}: {exc}", endpoint=self.shown) from None
        text = r.body[:500].decode("utf-8", errors="replace")
        if 400 <= r.status < 500:
            raise RequestError(f"POST {path}: {text}", status=r.status)
        if r.status != 200:
            raise ServerSick(f"POST {path} answered HTTP {r.status}: {text[:300]}", endpoint=self.shown,
                             status=r.status)
        try:
            return json.loads(r.body)
        except ValueError:
            raise ServerSick(f"POST {path}: the answer is not JSON: {text[:200]!r}",
                             endpoint=self.shown) from None

    async def tokenize(self, prompts: Sequence[ProbePrompt]) -> list[list[int]] | None:
        """Prompt token ids with the chat template applied, or None when this protocol has none."""
        return None

    async def generate(self, prompt: ProbePrompt, prompt_ids: Sequence[int] | None,
                       max_tokens: int) -> Generation:
        raise NotImplementedError

    async def score(self, prompt_ids: Sequence[int], target: Sequence[int], k: int) -> list[TokenScore]:
        """Each token of ``target`` scored after ``prompt_ids`` + the targets before it."""
        raise NotImplementedError(f"the {self.name} protocol has no prompt logprobs")


def _bad(path: str, what: str, url: str) -> ServerSick:
    return ServerSick(f"POST {path}: unexpected answer ({what})", endpoint=url)


class VLLMWire(Wire):
    name = "vllm"
    teacher_forcing = True
    token_ids = True

    async def tokenize(self, prompts: Sequence[ProbePrompt]) -> list[list[int]]:
        async def one(p: ProbePrompt) -> list[int]:
            data = await self.post("/tokenize", {"model": self.model, "messages": p.as_messages(),
                                                 "add_generation_prompt": True})
            tokens = data.get("tokens") if isinstance(data, dict) else None
            if not isinstance(tokens, list):
                raise _bad("/tokenize", "no tokens", self.shown)
            return [int(t) for t in tokens]

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    async def generate(self, prompt: ProbePrompt, prompt_ids: Sequence[int] | None,
                       max_tokens: int) -> Generation:
        body = {"model": self.model, "prompt": list(prompt_ids or []), "max_tokens": max_tokens,
                "temperature": 0.0, "return_token_ids": True}
        data = await self.post("/v1/completions", body)
        try:
            choice = data["choices"][0]
            ids = choice.get("token_ids")
            return Generation(choice.get("text") or "",
                              tuple(int(t) for t in ids) if ids is not None else None,
                              choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError, ValueError):
            raise _bad("/v1/completions", "no choices[0]", self.shown) from None

    async def score(self, prompt_ids: Sequence[int], target: Sequence[int], k: int) -> list[TokenScore]:
        if not target:
            return []
        body = {"model": self.model, "prompt": list(prompt_ids) + list(target), "max_tokens": 1,
                "temperature": 0.0, "prompt_logprobs": k}
        data = await self.post("/v1/completions", body)
        try:
            choice = data["choices"][0]
            positions = choice.get("prompt_logprobs")
            if positions is None:
                positions = data.get("prompt_logprobs")
            return parse_vllm_prompt_logprobs(positions, len(prompt_ids), target, k)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise _bad("/v1/completions", f"prompt_logprobs unreadable: {exc}", self.shown) from None


def parse_vllm_prompt_logprobs(positions: Sequence[Any], start: int, target: Sequence[int],
                               k: int) -> list[TokenScore]:
    """vLLM ``prompt_logprobs`` (one dict per prompt position) -> scores of ``target`` at ``start``.

    Each dict maps a token id (a string) to ``{logprob, rank, decoded_token}``: the ranks 1..k,
    plus the actual token when it ranks lower (it is then left out of the top-k).
    """
    out = []
    for j, token in enumerate(target):
        entry = positions[start + j]
        top: dict[int, float] = {}
        top1: int | None = None
        actual: float | None = None
        for key, value in entry.items():
            tid, lp, rank = int(key), float(value["logprob"]), int(value["rank"])
            if tid == token:
                actual = lp
            if rank <= k:
                top[tid] = lp
            if rank == 1:
                top1 = tid
        if actual is None or top1 is None:
            raise ValueError(f"position {start + j} lacks the actual token {token} or a rank-1 token")
        out.append(TokenScore(token, actual, top, top1))
    return out


class SGLangWire(Wire):
    name = "sglang"
    teacher_forcing = True
    token_ids = True

    async def tokenize(self, prompts: Sequence[ProbePrompt]) -> list[list[int]]:
        return await asyncio.to_thread(apply_chat_template, self.config, prompts, self.timeout)

    async def generate(self, prompt: ProbePrompt, prompt_ids: Sequence[int] | None,
                       max_tokens: int) -> Generation:
        body = {"input_ids": list(prompt_ids or []), "return_logprob": True, "logprob_start_len": -1,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0}}
        data = await self.post("/generate", body)
        try:
            if isinstance(data, list):
                data = data[0]
            meta = data.get("meta_info") or {}
            ids = data.get("output_ids")
            if ids is None:
                ids = [int(t[1]) for t in meta.get("output_token_logprobs") or []]
            finish = meta.get("finish_reason")
            reason = finish.get("type") if isinstance(finish, dict) else finish
            return Generation(data.get("text") or "", tuple(int(t) for t in ids), reason)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise _bad("/generate", "no output ids", self.shown) from None

    async def score(self, prompt_ids: Sequence[int], target: Sequence[int], k: int) -> list[TokenScore]:
        if not target:
            return []
        start = max(len(prompt_ids) - 1, 0)
        body = {"input_ids": list(prompt_ids) + list(target), "return_logprob": True,
                "logprob_start_len": start,
                "top_logprobs_num": k, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        data = await self.post("/generate", body)
        try:
            if isinstance(data, list):
                data = data[0]
            meta = data["meta_info"]
            return parse_sglang_input_logprobs(meta["input_token_logprobs"], meta["input_top_logprobs"],
                                               target)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise _bad("/generate", f"input logprobs unreadable: {exc}", self.shown) from None


def parse_sglang_input_logprobs(token_logprobs: Sequence[Any], top_logprobs: Sequence[Any],
                                target: Sequence[int]) -> list[TokenScore]:
    """SGLang ``input_token_logprobs`` / ``input_top_logprobs`` -> scores of the last len(target) tokens.

    Entries are ``[logprob, token_id, text_or_null]``, one per input position from
    ``logprob_start_len``; the entries are aligned from the end, and their token ids are checked.
    """
    n = len(target)
    if len(token_logprobs) < n or len(top_logprobs) < n:
        raise ValueError(f"{len(token_logprobs)} input logprobs for {n} target tokens")
    out = []
    for j, (lp_entry, top_entry) in enumerate(zip(token_logprobs[-n:], top_logprobs[-n:])):
        lp, tid = lp_entry[0], int(lp_entry[1])
        if tid != target[j] or lp is None:
            raise ValueError(f"target position {j}: got token {tid} (logprob {lp}), expected {target[j]}")
        top = {int(e[1]): float(e[0]) for e in (top_entry or []) if e[0] is not None}
        top1 = max(top, key=top.__getitem__) if top else tid
        out.append(TokenScore(tid, float(lp), top, top1))
    return out


class ChatWire(Wire):
    name = "chat"

    async def generate(self, prompt: ProbePrompt, prompt_ids: Sequence[int] | None,
                       max_tokens: int) -> Generation:
        body: dict[str, Any] = {"messages": prompt.as_messages(), "max_tokens": max_tokens,
                                "temperature": 0.0}
        if self.model:
            body["model"] = self.model
        data = await self.post("/v1/chat/completions", body)
        try:
            choice = data["choices"][0]
            return Generation(choice["message"].get("content") or "", None, choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError, AttributeError):
            raise _bad("/v1/chat/completions", "no choices[0].message", self.shown) from None


_TEMPLATE_CODE = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for line in sys.stdin:
    ids = tok.apply_chat_template(json.loads(line), add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    out.append([int(t) for t in ids])
json.dump(out, sys.stdout)
"""


def apply_chat_template(config: ServerConfig, prompts: Sequence[ProbePrompt],
                        timeout: float = 300.0) -> list[list[int]]:
    """Token ids of each prompt with the model's chat template, computed by the engine's Python."""
    import os

    stdin = "".join(json.dumps(p.as_messages(), ensure_ascii=False) + "\n" for p in prompts)
    try:
        proc = subprocess.run([python_of(config), "-c", _TEMPLATE_CODE, str(config.model)], input=stdin,
                              capture_output=True, text=True, timeout=timeout, env={**os.environ,
                                                                                    **config.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError("probe", [("chat template", f"cannot run the model's tokenizer: {exc}")]) from None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise ConfigError("probe", [("chat template", f"the model's tokenizer failed: {tail}")])
    return json.loads(proc.stdout)


WIRES: dict[str, type[Wire]] = {"vllm": VLLMWire, "sglang": SGLangWire, "chat": ChatWire}


def protocol_for(config: ServerConfig, protocol: str = "auto") -> str:
    """The probe protocol for a server: ``protocol`` unless ``auto``, else by engine."""
    if protocol != "auto":
        return protocol
    return config.engine if config.engine in ("vllm", "sglang") else "chat"


def open_wire(config: ServerConfig, protocol: str = "auto", *, concurrency: int = 8, timeout: float = 300.0,
              transport: Transport | None = None) -> Wire:
    return WIRES[protocol_for(config, protocol)](config, concurrency=concurrency, timeout=timeout,
                                                 transport=transport)


__all__ = [
    "WIRES",
    "ChatWire",
    "Generation",
    "SGLangWire",
    "TokenScore",
    "VLLMWire",
    "Wire",
    "apply_chat_template",
    "open_wire",
    "parse_sglang_input_logprobs",
    "parse_vllm_prompt_logprobs",
    "protocol_for",
]
