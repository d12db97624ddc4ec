"""The model's context length, and the check that keeps a prompt that cannot fit from being sent.

    guard = ContextGuard(config)                 # no I/O here
    reason = await guard.check(client, item)     # None: send it; else why it is skipped

Learning the limit (once, on the first check, so after the server is ready; the same for a server
harvest launched and an endpoint it does not manage), first answer wins:

    1. ``GET /v1/models``: ``max_model_len`` of the first model (vLLM; SGLang's newer builds)
    2. ``GET /server_info`` (then ``/get_server_info``): ``context_length``, else ``max_req_input_len`` (SGLang)
    3. ``GET /props``: ``default_generation_settings.n_ctx``, the context of one slot (llama.cpp)
    4. the model folder's ``config.json`` when ``[server] model`` is a local folder (``transformers
       serve`` reports nothing): the smallest of ``max_position_embeddings``, ``n_positions``,
       ``max_sequence_length``, ``seq_length``, ... (in ``text_config`` too), times a linear,
       dynamic or YaRN rope-scaling factor
    none of these: no context check; ``[data] max_prompt_tokens`` alone still applies.

An item is skipped when ``prompt tokens + max_tokens > context`` or ``prompt tokens >
max_prompt_tokens``. The prompt counted is the one of the item's last turn, as far as it is known
before generating: with ``history = "original"`` that whole prompt; with regenerated history the
system and user texts of every turn (the regenerated answers only add to it), so the count is never
more than what the last request will hold.

Counting, cheapest first:

- An upper bound without any request: the UTF-8 bytes of the texts plus ``TEMPLATE_MARGIN`` tokens
  for the chat template and ``MESSAGE_MARGIN`` per message. The tokenizers chat models use never
  make more tokens than bytes (byte-level BPE, SentencePiece with byte fallback: a token covers at
  least one byte), so a prompt under the limit by this bound is sent at once; almost every prompt
  is, and pays nothing.
- The engine's ``POST /tokenize``: vLLM's takes the messages and applies the chat template (exact);
  SGLang's (``prompt``) and llama.cpp's (``content``) take text, and count the texts without the
  template (a lower bound of the prompt).
- Without a tokenizer endpoint, the conservative character bound: ``ceil(bytes / MAX_BYTES_PER_TOKEN)``
  tokens. Tokens of natural text and code average 3-5 bytes; one of more than 16 bytes is rare
  (long runs of one character), so this never counts more tokens than the prompt has in practice:
  a prompt it skips cannot fit, while one near the limit may still be sent (and the engine answers
  or refuses it as it would have).

A ``max_tokens`` that leaves no room for any prompt is the job's mistake, not the items': the first
check raises :class:`~harvest.errors.ConfigError` (naming ``[sampling] max_tokens`` and the context)
and the run stops with every item still pending, instead of skipping them all.

A failed ``/tokenize`` falls back to the character bound for that item; nothing here fails an item
or stops a run, and nothing here changes what is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.config import HarvestConfig
from harvest.dataset import Item
from harvest.errors import ConfigError
from harvest.ledger import Failure, Status
from harvest.ledger.records import Key, as_key

log = logging.getLogger("harvest.campaign")

#: Tokens allowed for a chat template's own text (role headers, special tokens, a default system
#: prompt) in the no-request upper bound.
TEMPLATE_MARGIN = 256
#: Tokens allowed per message for the template's per-message framing.
MESSAGE_MARGIN = 16
#: Bytes of text one token covers at most, for the lower bound used without a tokenizer endpoint.
MAX_BYTES_PER_TOKEN = 16
#: Error class of an item skipped because its prompt cannot fit.
CONTEXT_CLASS = "context_length"
#: Seconds one ``/tokenize`` call may take (a 1 MB prompt takes well under one on a CPU).
TOKENIZE_TIMEOUT = 60.0

#: ``/tokenize`` body shapes to try, by engine: vLLM's chat form, SGLang's text, llama.cpp's text.
_DIALECTS = {"vllm": ["messages", "prompt"], "sglang": ["prompt", "messages"], "llamacpp": ["content"],
             "transformers": [], "openai": ["messages", "prompt", "content"],
             "command": ["messages", "prompt", "content"]}

_CONFIG_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                "max_seq_length", "seq_len", "model_max_length")


@dataclass(frozen=True)
class ContextLimit:
    """What the check measures against: the model's context (None: unknown) and where it came from."""

    tokens: int | None
    source: str


def config_context(model_dir: str | Path) -> int | None:
    """The context length a model folder's ``config.json`` declares, or None (no folder, no key)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    found: list[int] = []
    for table in (cfg, cfg.get("text_config"), cfg.get("llm_config")):
        if isinstance(table, dict):
            found += [v for k in _CONFIG_KEYS if isinstance(v := table.get(k), int) and not isinstance(v, bool)
                      and v > 0]
    if not found:
        return None
    length = min(found)
    rope = cfg.get("rope_scaling")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if kind in ("linear", "dynamic", "yarn") and isinstance(factor, (int, float)) and factor > 1:
            base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            length = int((base if isinstance(base, int) else length) * factor)
    return length


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class ContextGuard:
    """Learns the context once and checks each item against it (see the module docstring)."""

    def __init__(self, config: HarvestConfig):
        self.max_tokens = config.sampling.max_tokens
        self.max_prompt_tokens = config.data.max_prompt_tokens if config.data is not None else None
        self.original_history = config.run.history == "original"
        server = config.server
        self.engine = server.engine if server is not None else "openai"
        model = server.model if server is not None else None
        self.model_dir = model if model and Path(model).is_dir() else None
        self.limit: ContextLimit | None = None
        self._lock = asyncio.Lock()
        #: The ``/tokenize`` body shape that worked ("messages", "prompt", "content"), "" for none.
        self._dialect: str | None = None
        self.source = config.source
        self._misfit: ConfigError | None = None

    async def learn(self, client: Any) -> ContextLimit:
        """The context limit, asked of the server on the first call (see the module docstring)."""
        async with self._lock:
            if self.limit is None:
                self.limit = await self._learn(client)
                if self.limit.tokens is not None and self.max_tokens >= self.limit.tokens:
                    # Every item would be skipped: that is the job's mistake, not the items'.
                    self._misfit = ConfigError(self.source, [(
                        f"{self.source} [sampling] max_tokens",
                        f"{self.max_tokens} leaves no room for any prompt in the model's context of "
                        f"{self.limit.tokens} tokens ({self.limit.source}); lower it")])
                if self.limit.tokens is not None:
                    log.info("context: %d tokens (%s); prompts that cannot fit with max_tokens %d are skipped",
                             self.limit.tokens, self.limit.source, self.max_tokens)
                else:
                    log.info("context: unknown (%s)%s", self.limit.source,
                             f"; prompts over max_prompt_tokens {self.max_prompt_tokens} are skipped"
                             if self.max_prompt_tokens else "")
            if self._misfit is not None:
                raise self._misfit
            return self.limit

    async def _learn(self, client: Any) -> ContextLimit:
        answer = await client.side_request("GET", "/v1/models")
        if answer is not None and answer[0] == 200 and isinstance(answer[1], dict):
            models = answer[1].get("data")
            if isinstance(models, list) and models and isinstance(models[0], dict):
                if (n := _positive_int(models[0].get("max_model_len"))) is not None:
                    return ContextLimit(n, "max_model_len on /v1/models")
        if self.engine in ("sglang", "openai", "command"):
            for path in ("/server_info", "/get_server_info"):
                answer = await client.side_request("GET", path)
                if answer is not None and answer[0] == 200 and isinstance(answer[1], dict):
                    for key in ("context_length", "max_req_input_len"):
                        if (n := _positive_int(answer[1].get(key))) is not None:
                            return ContextLimit(n, f"{key} on {path}")
        if self.engine in ("llamacpp", "openai", "command"):
            answer = await client.side_request("GET", "/props")
            if answer is not None and answer[0] == 200 and isinstance(answer[1], dict):
                settings = answer[1].get("default_generation_settings")
                if isinstance(settings, dict) and (n := _positive_int(settings.get("n_ctx"))) is not None:
                    return ContextLimit(n, "n_ctx per slot on /props")
        if self.model_dir is not None:
            n = await asyncio.to_thread(config_context, self.model_dir)
            if n is not None:
                return ContextLimit(n, f"{Path(self.model_dir).name}/config.json")
        return ContextLimit(None, "the server reports none and the model has no local config.json")

    def prompt_limit(self, max_tokens: int | None = None) -> int | None:
        """Most prompt tokens an item may have, or None when nothing bounds it. ``max_tokens``: the
        item's own (a batch row's body), else ``[sampling] max_tokens``."""
        limits = [n for n in (self.max_prompt_tokens,) if n is not None]
        if self.limit is not None and self.limit.tokens is not None:
            limits.append(self.limit.tokens - (max_tokens or self.max_tokens))
        return min(limits) if limits else None

    def prompt_messages(self, item: Item) -> list[dict[str, str]]:
        """The part of the item's last prompt known before generating (see the module docstring)."""
        last = item.history(item.turns - 1)
        if self.original_history or item.turns == 1:
            return [{"role": m.role, "content": m.content} for m in last]
        system = [{"role": m.role, "content": m.content} for m in last if m.role == "system"]
        return [*system, {"role": "user", "content": "\n".join(item.user_turns())}]

    async def check(self, client: Any, item: Item) -> str | None:
        """None when the item may be sent; else the reason it is skipped, with its length and the limit."""
        if self.limit is None or self._misfit is not None:
            await self.learn(client)
        own = item.request.get("max_tokens") if item.request is not None else None
        limit = self.prompt_limit(own)
        if limit is None:
            return None
        messages = self.prompt_messages(item)
        size = sum(len(m["content"].encode("utf-8")) for m in messages)
        if size + TEMPLATE_MARGIN + MESSAGE_MARGIN * len(messages) <= limit:
            return None  # fits even if every byte were a token
        counted = await self._tokenize(client, messages)
        if counted is not None:
            tokens, how = counted
        else:
            tokens, how = math.ceil(size / MAX_BYTES_PER_TOKEN), f"at least, from {size} bytes"
        if tokens <= limit:
            return None
        return self._reason(tokens, how, own or self.max_tokens)

    async def skipped(self, client: Any, writer: Any, progress: Any, row_id: str | Key, item: Item) -> bool:
        """The runner's hook: check the item; when it cannot fit, record it ``skipped`` (class
        ``context_length``, the reason as its error) through the ledger writer and return True."""
        reason = await self.check(client, item)
        if reason is None:
            return False
        item_id, sample = as_key(row_id)
        writer.skip(Failure(item_id, reason, CONTEXT_CLASS, sample))
        progress.record(Status.SKIPPED.value)
        progress.error(CONTEXT_CLASS)
        return True

    def _reason(self, tokens: int, how: str, max_tokens: int) -> str:
        context = self.limit.tokens if self.limit is not None else None
        if context is not None and tokens + max_tokens > context and (
                self.max_prompt_tokens is None or context - max_tokens <= self.max_prompt_tokens):
            return (f"prompt of {tokens} tokens ({how}) + max_tokens {max_tokens} does not fit the model's "
                    f"context of {context} tokens ({self.limit.source})")  # type: ignore[union-attr]
        return f"prompt of {tokens} tokens ({how}) is over [data] max_prompt_tokens = {self.max_prompt_tokens}"

    async def _tokenize(self, client: Any, messages: list[dict[str, str]]) -> tuple[int, str] | None:
        """``(tokens, how counted)`` from the engine's ``/tokenize``, or None without one."""
        text = "\n".join(m["content"] for m in messages)
        bodies: dict[str, dict[str, Any]] = {"messages": {"messages": messages, "add_generation_prompt": True},
                  "prompt": {"prompt": text}, "content": {"content": text}}
        if client.model is not None:
            bodies["messages"]["model"] = bodies["prompt"]["model"] = client.model
        if self._dialect == "":
            return None
        order = [self._dialect] if self._dialect else _DIALECTS.get(self.engine, _DIALECTS["openai"])
        for dialect in order:
            try:
                answer = await client.side_request("POST", "/tokenize", bodies[dialect], timeout=TOKENIZE_TIMEOUT)
            except (TypeError, ValueError):  # text JSON cannot carry: the generation request fails on it
                return None
            if answer is None:
                return None  # no answer: the character bound for this item, the same dialect next time
            status, body = answer
            count = body.get("count") if isinstance(body, dict) else None
            tokens = body.get("tokens") if isinstance(body, dict) else None
            n = count if isinstance(count, int) else len(tokens) if isinstance(tokens, list) else None
            # A server that ignores the field it does not know counts nothing (llama.cpp without
            # "content"): that is not an answer.
            if status == 200 and n:
                self._dialect = dialect
                how = "counted with the chat template" if dialect == "messages" else "texts counted by /tokenize"
                return n, how
            if status == 404 or status == 405:
                self._dialect = ""  # no tokenizer endpoint at all
                return None
        self._dialect = ""  # no shape was understood
        return None


__all__ = ["CONTEXT_CLASS", "ContextGuard", "ContextLimit", "MAX_BYTES_PER_TOKEN", "MESSAGE_MARGIN",
           "TEMPLATE_MARGIN", "config_context"]
