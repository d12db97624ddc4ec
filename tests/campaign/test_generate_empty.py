"""``generate_item`` and empty answers: asked again ``[run] empty_retries`` times with the same
settings, then the item fails with class ``empty``; an answer that is only reasoning is empty too.
A scripted client stands in for the server (the real-server cases are in test_breaker_run.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from harvest.campaign.run.generate import generate_item
from harvest.client.records import Completion
from harvest.config import RunConfig, SamplingConfig
from harvest.dataset.records import Item, Message


class Scripted:
    """Answers from a list, in order; records every request."""

    def __init__(self, *texts: str):
        self.texts = list(texts)
        self.requests: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    async def chat(self, messages, **overrides):
        self.requests.append((list(messages), overrides))
        text = self.texts.pop(0)
        return Completion(text, None, "stop", 5, len(text.split()), "http://fake", 0.01)


ITEM = Item("a", "in.jsonl", 1, (Message("user", "Hi?"),))


def run(client: Scripted, **run_fields: Any):
    return asyncio.run(generate_item(client, ITEM, run=RunConfig(**run_fields), sampling=SamplingConfig(),
                                     settings_hash="h"))


def test_empty_then_an_answer_is_done_after_one_more_ask_with_the_same_settings():
    client = Scripted("", "Hello there.")
    gen = run(client)
    assert gen.dropped is None and gen.output["messages"][-1]["content"] == "Hello there."
    assert gen.attempts == 2
    assert client.requests[0] == client.requests[1]  # the same request, no override


def test_an_answer_that_stays_empty_fails_with_class_empty():
    for blank in ("", "  \n\t "):
        client = Scripted(blank, blank)
        gen = run(client)
        assert gen.dropped is not None and gen.drop_class == "empty" and "asked 2 times" in gen.dropped
        assert gen.attempts == 2 and len(client.requests) == 2


def test_empty_retries_is_configurable():
    client = Scripted("", "", "", "finally")
    assert run(client, empty_retries=3).dropped is None and len(client.requests) == 4
    client = Scripted("")
    gen = run(client, empty_retries=0)
    assert gen.drop_class == "empty" and "asked 1 time)" in gen.dropped and len(client.requests) == 1


def test_reasoning_without_an_answer_is_empty():
    gen = run(Scripted("<think>Let me think.</think>", "<think>Still thinking.</think>\n"))
    assert gen.drop_class == "empty"
    # with reasoning not separated, the think block is the answer
    assert run(Scripted("<think>Let me think.</think>"), reasoning="none").dropped is None
