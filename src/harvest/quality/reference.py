"""The reference and the candidates' outputs on the probe set, and where the reference is stored.

    reference = await generate_reference(wire, prompts, probe, settings_hash=h)   # trusted server
    save_reference(folder / REFERENCE_FILE, reference)
    outputs = await run_candidate(wire, reference, probe)                         # any other server

The reference answers each probe prompt greedily (temperature 0) and then scores its own tokens
teacher-forced with top-k logprobs, so the reference distribution and a candidate's come from the
same kind of forward pass (prefill), never decode against prefill. A candidate answers the same
prompt ids greedily (free-running) and scores the reference's tokens teacher-forced.

The reference is a JSON Lines file: a header line (schema, settings hash, protocol, k, max_tokens,
server settings) and one line per prompt. It is reused while the hash of the reference settings and
the probe set is unchanged (:func:`reference_hash`), so a sweep generates it once.

A prompt that fails on the reference (e.g. longer than the context) is left out, with its reason,
and never sent to candidates. This module never launches or stops a server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.config import ServerConfig
from harvest.errors import RequestError
from harvest.quality.probe import ProbePrompt, prompt_ids_digest
from harvest.quality.settings import ProbeSettings
from harvest.quality.wire import Generation, TokenScore, Wire

REFERENCE_SCHEMA = "harvest.reference/1"
REFERENCE_FILE = "reference.jsonl"

#: Server fields that cannot change what the model writes (left out of the reference hash).
_NEUTRAL_FIELDS = {"host", "port", "python", "env", "ready_timeout", "stop_grace", "stop_deadline",
                   "api_key_env", "health_url", "gpus"}


@dataclass(frozen=True)
class ProbeOutput:
    """One prompt on one server: its greedy answer and its scores of the reference tokens."""

    id: str
    generation: Generation | None
    #: Teacher-forced scores of the reference's tokens (None: not scored, or no teacher forcing).
    scores: tuple[TokenScore, ...] | None = None
    #: Why this prompt failed on this server (None when it did not).
    error: str | None = None


@dataclass(frozen=True)
class ReferenceEntry:
    """One prompt of the reference: the prompt, its token ids and the reference's output on it."""

    prompt: ProbePrompt
    prompt_ids: tuple[int, ...] | None
    output: ProbeOutput


@dataclass(frozen=True)
class Reference:
    """The trusted server's answers and self-scores on the probe set."""

    settings_hash: str
    protocol: str
    top_k: int
    max_tokens: int
    entries: tuple[ReferenceEntry, ...]
    server: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    #: Prompts left out: (id, reason).
    excluded: tuple[tuple[str, str], ...] = ()

    @property
    def teacher_forcing(self) -> bool:
        return any(e.output.scores is not None for e in self.entries)


def server_settings(config: ServerConfig) -> dict[str, Any]:
    """The server settings that can change outputs (what the reference hash covers)."""
    return config.recorded(exclude=set(_NEUTRAL_FIELDS))


def reference_hash(config: ServerConfig, probe: ProbeSettings, prompts: Sequence[ProbePrompt],
                   protocol: str) -> str:
    """Hash of everything a stored reference depends on: reference settings, probe set and knobs."""
    doc = {"server": server_settings(config), "prompts": prompt_ids_digest(prompts), "protocol": protocol,
           "top_k": probe.top_k, "max_tokens": probe.max_tokens}
    return hashlib.blake2b(json.dumps(doc, sort_keys=True).encode(), digest_size=12).hexdigest()


async def _tokenized(wire: Wire, prompts: Sequence[ProbePrompt]) -> list[tuple[int, ...] | None]:
    ids = await wire.tokenize(prompts)
    return [tuple(x) for x in ids] if ids is not None else [None] * len(prompts)


async def generate_reference(wire: Wire, prompts: Sequence[ProbePrompt], probe: ProbeSettings, *,
                             settings_hash: str, server: dict[str, Any] | None = None) -> Reference:
    """Greedy answers of the reference server, then its own teacher-forced scores of them.

    Raises ServerSick when the server fails; a prompt the server rejects (4xx) is excluded.
    """
    ids = await _tokenized(wire, prompts)

    async def one(prompt: ProbePrompt,
                  prompt_ids: tuple[int, ...] | None) -> ReferenceEntry | tuple[str, str]:
        try:
            gen = await wire.generate(prompt, prompt_ids, probe.max_tokens)
            scores = None
            if wire.teacher_forcing and prompt_ids is not None and gen.token_ids is not None:
                scores = tuple(await wire.score(prompt_ids, gen.token_ids, probe.top_k))
        except RequestError as exc:
            return (prompt.id, str(exc))
        return ReferenceEntry(prompt, prompt_ids, ProbeOutput(prompt.id, gen, scores))

    results = await asyncio.gather(*(one(p, i) for p, i in zip(prompts, ids)))
    entries = tuple(r for r in results if isinstance(r, ReferenceEntry))
    excluded = tuple(r for r in results if isinstance(r, tuple))
    return Reference(settings_hash, wire.name, probe.top_k, probe.max_tokens, entries, dict(server or {}),
                     time.time(), excluded)


async def run_candidate(wire: Wire, reference: Reference, probe: ProbeSettings) -> list[ProbeOutput]:
    """A candidate's greedy answers on the reference's prompts and its scores of the reference's tokens.

    A prompt the candidate rejects is recorded with its error; ServerSick propagates.
    """
    score = wire.teacher_forcing and reference.teacher_forcing

    async def one(entry: ReferenceEntry) -> ProbeOutput:
        ref = entry.output.generation
        try:
            gen = await wire.generate(entry.prompt, entry.prompt_ids, reference.max_tokens)
            scores = None
            if score and entry.prompt_ids is not None and ref is not None and ref.token_ids is not None:
                scores = tuple(await wire.score(entry.prompt_ids, ref.token_ids, reference.top_k))
        except RequestError as exc:
            return ProbeOutput(entry.prompt.id, None, None, str(exc))
        return ProbeOutput(entry.prompt.id, gen, scores)

    return list(await asyncio.gather(*(one(e) for e in reference.entries)))


# --- storage -------------------------------------------------------------------------------------


def _score_json(s: TokenScore) -> list[Any]:
    return [s.token, s.logprob, s.top1, [[t, lp] for t, lp in s.top.items()]]


def _score_from(v: list[Any]) -> TokenScore:
    return TokenScore(int(v[0]), float(v[1]), {int(t): float(lp) for t, lp in v[3]}, int(v[2]))


def output_json(o: ProbeOutput) -> dict[str, Any]:
    g = o.generation
    return {"id": o.id, "error": o.error,
            "text": g.text if g else None,
            "token_ids": list(g.token_ids) if g and g.token_ids is not None else None,
            "finish_reason": g.finish_reason if g else None,
            "scores": [_score_json(s) for s in o.scores] if o.scores is not None else None}


def output_from(d: dict[str, Any]) -> ProbeOutput:
    gen = None
    if d.get("text") is not None:
        ids = d.get("token_ids")
        gen = Generation(d["text"], tuple(ids) if ids is not None else None, d.get("finish_reason"))
    scores = tuple(_score_from(v) for v in d["scores"]) if d.get("scores") is not None else None
    return ProbeOutput(str(d["id"]), gen, scores, d.get("error"))


def save_reference(path: Path, reference: Reference) -> Path:
    """Write the reference atomically (a temporary file renamed into place)."""
    path = Path(path)
    header = {"schema": REFERENCE_SCHEMA, "settings_hash": reference.settings_hash,
              "protocol": reference.protocol,
              "top_k": reference.top_k, "max_tokens": reference.max_tokens, "server": reference.server,
              "created_at": reference.created_at, "excluded": [list(x) for x in reference.excluded]}
    with safefiles.hold(path.parent, create=True) as folder:
        folder.check_file(path.name)
        tmp, fd = folder.temp(path.name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(header, ensure_ascii=False) + "\n")
                for e in reference.entries:
                    line = {"prompt": e.prompt.to_json(),
                            "prompt_ids": list(e.prompt_ids) if e.prompt_ids is not None else None,
                            "output": output_json(e.output)}
                    fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            folder.replace(tmp, path.name)
        except BaseException:
            folder.unlink(tmp)
            raise
    return path


def load_reference(path: Path, settings_hash: str | None = None) -> Reference | None:
    """The stored reference, or None when absent, unreadable or made for other settings."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return None
    if not lines or lines[0].get("schema") != REFERENCE_SCHEMA:
        return None
    h = lines[0]
    if settings_hash is not None and h.get("settings_hash") != settings_hash:
        return None
    try:
        entries = tuple(ReferenceEntry(ProbePrompt.from_json(d["prompt"]),
                                       tuple(d["prompt_ids"]) if d.get("prompt_ids") is not None else None,
                                       output_from(d["output"])) for d in lines[1:])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return Reference(h["settings_hash"], h["protocol"], int(h["top_k"]), int(h["max_tokens"]), entries,
                     h.get("server") or {}, float(h.get("created_at") or 0.0),
                     tuple((str(a), str(b)) for a, b in h.get("excluded") or []))


def save_outputs(path: Path, outputs: Sequence[ProbeOutput]) -> Path:
    """A candidate's outputs as JSON Lines (for inspection; never read back by harvest)."""
    path = Path(path)
    with safefiles.hold(path.parent, create=True) as folder, folder.open_text(path.name, "w") as fh:
        for o in outputs:
            fh.write(json.dumps(output_json(o), ensure_ascii=False) + "\n")
    return path


__all__ = [
    "REFERENCE_FILE",
    "REFERENCE_SCHEMA",
    "ProbeOutput",
    "Reference",
    "ReferenceEntry",
    "generate_reference",
    "load_reference",
    "output_from",
    "output_json",
    "reference_hash",
    "run_candidate",
    "save_outputs",
    "save_reference",
    "server_settings",
]
