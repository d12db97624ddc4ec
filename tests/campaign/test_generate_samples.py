"""``generate_samples``: how the samples of an item are asked for (one request with ``n``, or one
per sample with distinct seeds), and multi-turn samples as independent rollouts. A scripted client
stands in for the server (the real-server cases are in test_distill.py and test_distill_llama.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from harvest.campaign.run.generate import generate_samples
from harvest.client.records import Completion
from harvest.config import RunConfig, SamplingConfig
from harvest.dataset.records import Item, Message


class Scripted:
    """Answers every request with its number; ``n`` gives n choices. Records every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    async def chat(self, messages, **overrides):
        self.requests.append((list(messages), overrides))
        k = len(self.requests)
        choices = [Completion(f"answer {k}.{i}", None, "stop", 5, 3, "http://fake", 0.01)
                   for i in range(overrides.get("n", 1))]
        return dataclasses.replace(choices[0], others=tuple(choices[1:]))


ONE = Item("a", "in.jsonl", 1, (Message("user", "Hi?"),))
TWO = Item("b", "in.jsonl", 2, (Message("user", "Hi?"), Message("assistant", "x"), Message("user", "More?")))


def run(client: Scripted, item: Item, samples: list[int], one_request: bool, **sampling: Any):
    return asyncio.run(generate_samples(client, item, samples, run=RunConfig(), settings_hash="h",
                                        sampling=SamplingConfig(**sampling), one_request=one_request))


def test_one_request_with_n():
    client = Scripted()
    gens = run(client, ONE, [0, 1, 2, 3], True, n=4, temperature=1.0)
    assert len(client.requests) == 1 and client.requests[0][1]["n"] == 4
    assert [g.sample for g in gens] == [0, 1, 2, 3]
    assert [g.output["messages"][-1]["content"] for g in gens] == [f"answer 1.{i}" for i in range(4)]


def test_separate_requests_with_distinct_seeds():
    client = Scripted()
    gens = run(client, ONE, [0, 1, 2], False, n=3, seed=100)
    assert len(client.requests) == 3 and all("n" not in o for _, o in client.requests)
    assert sorted(o.get("seed", 100) for _, o in client.requests) == [100, 101, 102]
    assert len({g.output["messages"][-1]["content"] for g in gens}) == 3


def test_a_resumed_partial_group_is_seeded_from_its_first_sample():
    client = Scripted()
    run(client, ONE, [2, 3], True, n=4, seed=100)
    assert client.requests[0][1]["n"] == 2 and client.requests[0][1]["seed"] == 102


def test_multi_turn_samples_continue_on_their_own_history():
    client = Scripted()
    gens = run(client, TWO, [0, 1, 2], True, n=3)
    assert len(client.requests) == 1 + 3  # turn 0 once with n = 3, turn 1 once per sample
    for i, gen in enumerate(gens):
        history = next(m for m, o in client.requests[1:] if m[1]["content"] == f"answer 1.{i}")
        assert [m["role"] for m in history] == ["user", "assistant", "user"]
        assert gen.output["messages"][1]["content"] == f"answer 1.{i}"
        assert len(gen.output["turns"]) == 2
