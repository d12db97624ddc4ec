"""Prefix-aware send order (campaign/run/order.py): groups in the claim window go out together, FIFO
when nothing is shared, no row starves, and nothing is lost or sent twice."""

from __future__ import annotations

import random

import pytest

from harvest.campaign.run.order import PrefixOrder, prefix_key
from harvest.dataset.records import Item, Message
from harvest.ledger import ItemRow


def row(i: int, system: str | None, question: str) -> ItemRow:
    messages = ((Message("system", system),) if system else ()) + (Message("user", question),)
    return ItemRow(id=f"i{i}", attempts=0, item=Item(id=f"i{i}", source="d.jsonl", source_line=i + 1,
                                                     messages=messages))


def drain(order: PrefixOrder) -> list[ItemRow]:
    out = []
    while len(order):
        out.append(order.pop())
    return out


def runs(keys: list[str]) -> int:
    """How many runs of equal keys the sequence has (one per group when grouped perfectly)."""
    return sum(1 for a, b in zip([None, *keys], keys) if a != b)


def test_shared_system_prompts_shuffled_go_out_grouped():
    rng = random.Random(23)
    rows = [row(i, f"system prompt {i % 8} " + "x" * 200, f"question {i}") for i in range(200)]
    rng.shuffle(rows)
    order = PrefixOrder()
    order.add(rows)
    sent = drain(order)
    assert sorted(r.id for r in sent) == sorted(r.id for r in rows)  # every row once
    keys = [prefix_key(r.item) for r in sent]
    assert runs(keys) == 8, runs(keys)  # one run per system prompt
    assert runs([prefix_key(r.item) for r in rows]) > 150  # FIFO would have sent them scattered


def test_nothing_shared_stays_fifo():
    rows = [row(i, None, f"Question {i}: explain how topic {i * 7919 % 1000} works.") for i in range(300)]
    order = PrefixOrder()
    order.add(rows[:150])
    sent = [order.pop() for _ in range(100)]
    order.add(rows[150:])
    sent += drain(order)
    assert [r.id for r in sent] == [r.id for r in rows]


def test_a_long_shared_head_without_system_prompt_is_one_key():
    head = "Read the passage and answer. " * 60
    a, b = row(1, None, head + "Who?"), row(2, None, head + "When?")
    assert prefix_key(a.item) == prefix_key(b.item)
    assert prefix_key(row(3, None, "short one").item) != prefix_key(row(4, None, "short two").item)


def test_the_oldest_row_is_not_passed_over_forever():
    order = PrefixOrder(patience=5)
    order.add([row(0, None, "the lonely one, unlike any other prompt here")])
    hot = [row(i, "hot system prompt", f"q{i}") for i in range(1, 100)]
    order.add(hot[:1])
    first = order.pop()  # the oldest: the lonely one
    assert first.id == "i0"
    order.add([row(100, None, "another lonely prompt, alone in its group")])
    order.add(hot[1:])
    sent = [order.pop().id for _ in range(10)]
    # the hot group goes first, but the lonely row waits at most `patience` pops
    assert "i100" in sent[:7], sent


def test_drain_gives_back_every_held_row_in_claim_order():
    order = PrefixOrder()
    rows = [row(i, f"p{i % 3}", f"q{i}") for i in range(10)]
    order.add(rows)
    order.pop()
    ids = order.drain()
    assert len(ids) == 9 and ids == [r.key for r in rows if r.key in ids]
    assert len(order) == 0
    with pytest.raises(IndexError):
        order.pop()


async def test_a_conversations_turns_go_to_one_server_with_affinity_and_spread_without():
    """Through the real client over two endpoints: every turn of a 3-turn conversation goes to the
    server of its first turn with its prefix key; without a key, least-outstanding alternates."""
    import json

    from harvest.campaign.run.generate import generate_item
    from harvest.client import Client, MockTransport, RawResponse
    from harvest.config import ClientConfig, RunConfig, SamplingConfig

    seen: list[str] = []

    async def handler(method, url, body, headers):
        seen.append(url.split("/v1/")[0])
        answer = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        return RawResponse(200, json.dumps(answer).encode())

    messages = (Message("user", "first"), Message("assistant", "-"), Message("user", "second"),
                Message("assistant", "-"), Message("user", "third"))
    async with Client(["http://a:1", "http://b:1"], ClientConfig(concurrency=4), model="m",
                      transport=MockTransport(handler)) as client:
        for i in range(6):
            item = Item(f"c{i}", "d.jsonl", i + 1, messages)
            seen.clear()
            gen = await generate_item(client, item, run=RunConfig(), sampling=SamplingConfig(), settings_hash="h",
                                      affinity=f"conversation {i}")
            assert gen.dropped is None and len(seen) == 3
            assert len(set(seen)) == 1, seen  # all three turns on one server
        seen.clear()
        await generate_item(client, Item("x", "d.jsonl", 9, messages), run=RunConfig(), sampling=SamplingConfig(),
                            settings_hash="h")
        assert len(set(seen)) == 2, seen  # no key: round-robin among equals


def test_the_window_deepens_only_while_the_claimed_rows_share_prefixes():
    """40 system prompts shuffled: a window of 64 holds one or two rows of each, so it deepens to
    LOOKAHEAD once the rows show it; rows that share nothing, share one prompt, come sorted by
    prompt (FIFO groups them already), or a disabled order keep 64."""
    from harvest.campaign.run.order import LOOKAHEAD

    rng = random.Random(5)
    shared = [row(i, f"system prompt {i % 40} " + "y" * 300, f"question {i}") for i in range(1000)]
    rng.shuffle(shared)
    alone = [row(i, f"system prompt of row {i} alone " + "z" * 300, f"question {i}") for i in range(1000)]
    one = [row(i, "the one system prompt of every row " + "v" * 300, f"question {i}") for i in range(1000)]
    in_order = sorted(shared, key=lambda r: prefix_key(r.item))  # already grouped: FIFO groups it
    cases = ((shared, True, True), (alone, True, False), (one, True, False), (in_order, True, False),
             (shared, False, False))
    for rows, enabled, deep in cases:
        order = PrefixOrder(enabled=enabled)
        assert order.depth(64) == 64  # nothing seen yet: the client's own window
        order.add(rows[:64])
        assert order.depth(64) == (LOOKAHEAD if deep else 64), (enabled, deep)
        assert order.depth(4096) == 4096  # never shallower than the client's own


def test_a_deep_window_groups_what_a_short_one_cannot(monkeypatch):
    """The same shuffled 40 x 25 through a dispatch-like loop (32 in flight, refill to depth()):
    with the deep window nearly every prefix goes out in one run; held to the client's window of 64
    the order finds runs of ~2 rows; disabled (FIFO), of ~1."""
    from harvest.campaign.run import order as order_module

    rng = random.Random(7)
    rows = [row(i, f"system prompt {i % 40} " + "w" * 300, f"question {i}") for i in range(1000)]
    rng.shuffle(rows)

    def send(order: PrefixOrder) -> list[str]:
        pending, sent = list(rows), []
        while pending or len(order):
            want = order.depth(64) - 32 - len(order)  # 32 in flight all along
            if want > 0 and pending:
                order.add(pending[:want])
                del pending[:want]
            sent.append(order.pop())
        assert sorted(r.id for r in sent) == sorted(r.id for r in rows)  # every row once
        return [prefix_key(r.item) for r in sent]

    assert runs(send(PrefixOrder())) <= 60
    assert runs(send(PrefixOrder(enabled=False))) > 900
    monkeypatch.setattr(order_module, "LOOKAHEAD", 64)
    assert runs(send(PrefixOrder())) > 400
