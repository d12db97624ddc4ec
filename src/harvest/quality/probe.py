"""The probe set: the prompts a reference and its candidates are compared on.

    prompts = select_prompts(job.data, n=32, seed=0, extra=Path("hard-cases.jsonl"))

``n`` prompts are drawn from the job's dataset by a seeded hash of each item's stable id: the items
with the ``n`` smallest ``blake2b(seed, id)`` values. The draw is deterministic (same file, seed and
n give the same prompts, in the same order), spread over the whole file, and streams it keeping
only ``n`` items in memory. Prompts of an optional extra file (any shape the dataset layer reads)
are appended after them, all of them. A conversation of several turns is probed at its last user
turn, on top of its original earlier turns.

This module only reads datasets; it never sends a request and never writes a file.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest.config import DataConfig
from harvest.dataset import Item, iter_items
from harvest.errors import ConfigError


@dataclass(frozen=True)
class ProbePrompt:
    """One probe prompt: a stable id and the chat messages to answer."""

    id: str
    messages: tuple[tuple[str, str], ...]

    def as_messages(self) -> list[dict[str, Any]]:
        """OpenAI-style ``[{"role", "content"}, ...]``."""
        return [{"role": role, "content": content} for role, content in self.messages]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.as_messages()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbePrompt:
        return cls(str(data["id"]), tuple((m["role"], m["content"]) for m in data["messages"]))


def probe_prompt(item: Item, prompt_id: str | None = None) -> ProbePrompt:
    """The prompt of ``item`` at its last user turn (earlier turns as the input had them)."""
    history = item.history(item.turns - 1, None)
    return ProbePrompt(prompt_id or item.id, tuple((m.role, m.content) for m in history))


def _rank(seed: int, item_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x00{item_id}".encode(), digest_size=16).digest()


def draw(items: Iterable[object], n: int, seed: int) -> list[Item]:
    """The ``n`` items with the smallest seeded hash of their ids, in that hash order.

    Non-items (skipped rows) are ignored; a repeated id counts once.
    """
    if n <= 0:
        return []
    heap: list[tuple[bytes, int, Item]] = []  # max-heap by rank through negated bytes
    seen: set[str] = set()
    for position, item in enumerate(items):
        if not isinstance(item, Item) or item.id in seen:
            continue
        rank = _rank(seed, item.id)
        key = bytes(255 - b for b in rank)
        if len(heap) < n:
            heapq.heappush(heap, (key, -position, item))
            seen.add(item.id)
        elif key > heap[0][0]:
            dropped = heapq.heapreplace(heap, (key, -position, item))
            seen.discard(dropped[2].id)
            seen.add(item.id)
    return [entry[2] for entry in sorted(heap, key=lambda e: e[0], reverse=True)]


def read_extra(path: str | Path, template: DataConfig | None = None) -> Iterator[Item]:
    """Every usable item of an extra prompt file (same field mapping as the job when given)."""
    fields: dict[str, Any] = {}
    if template is not None:
        fields = template.model_dump(include={"prompt_field", "messages_field", "conversations_field",
                                              "system_prompt", "id_field"})
    config = DataConfig(path=str(path), **fields)
    for item in iter_items(config):
        if isinstance(item, Item):
            yield item


def select_prompts(data: DataConfig | None, *, n: int, seed: int = 0,
                   extra: str | Path | None = None) -> list[ProbePrompt]:
    """The probe set: ``n`` prompts drawn from ``data`` plus every prompt of ``extra``.

    Raises :class:`ConfigError` when the set would be empty or ``n`` prompts are asked for
    without a dataset.
    """
    chosen: list[ProbePrompt] = []
    if n > 0:
        if data is None:
            raise ConfigError("probe", [("[probe] prompts",
                                         f"{n} prompts asked for, but there is no [data] table")])
        chosen = [probe_prompt(item) for item in draw(iter_items(data), n, seed)]
    ids = {p.id for p in chosen}
    if extra is not None:
        for item in read_extra(extra, data):
            # Without the job's id field, the file's own "id" (if any) names the prompt.
            prompt = probe_prompt(item, item.id if data is not None and data.id_field else item.raw_id)
            if prompt.id not in ids:
                chosen.append(prompt)
                ids.add(prompt.id)
    if not chosen:
        raise ConfigError("probe", [("[probe]", "the probe set is empty (no prompts drawn, no extra file)")])
    return chosen


def prompt_ids_digest(prompts: Sequence[ProbePrompt]) -> str:
    """A short digest of the probe set's content (ids and messages), for the reference hash."""
    h = hashlib.blake2b(digest_size=12)
    for p in prompts:
        h.update(p.id.encode())
        for role, content in p.messages:
            h.update(b"\x00" + role.encode() + b"\x01" + content.encode("utf-8", "surrogatepass"))
        h.update(b"\x02")
    return h.hexdigest()


__all__ = ["ProbePrompt", "draw", "probe_prompt", "prompt_ids_digest", "read_extra", "select_prompts"]
