"""R4: property-based tests of the answers' door (``client/replies.py``).

- Arbitrary bytes, and chat or text completions whose every field may be any JSON value (strings
  with lone surrogates and control characters, huge and non-finite numbers, nested lists): either
  a ``Completion`` comes back whose stored parts encode as the ledger stores them (UTF-8 JSON, token
  counts integers in range or None) or ``BadReply`` does; nothing else escapes.
- Streams of such chunks: each event is taken or ends the stream; the answer is a ``Completion`` or a
  ``BadReply``, and past its caps an ``Oversized``; nothing else escapes.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest.client import replies
from harvest.client.records import Completion
from harvest.ledger.handle import dumps
from harvest.transport import Oversized, RawResponse

LIMITS = replies.limits_for({"max_tokens": 8}, replies.BYTES_PER_TOKEN, 100)

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                    st.sampled_from(["\ud800", "a\udfffb", "\x1b[2J", "stop", "length", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def encoded(doc: Any) -> bytes:
    """JSON as a server may write it: NaN and lone surrogates escaped, not refused."""
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")


def stored(done: Completion) -> None:
    for choice in done.choices:
        dumps({"text": choice.text, "reasoning": choice.reasoning_content, "finish": choice.finish_reason,
               "sent": choice.finish_reason_sent, "model": choice.model}).encode("utf-8")
        for count in (choice.prompt_tokens, choice.completion_tokens):
            assert count is None or (type(count) is int and 0 <= count < 2**31), count


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=values, reasoning=values, finish=values, usage=values, model=values, index=values,
       text=values, chat=st.booleans())
def test_any_field_of_any_type_gives_a_completion_that_stores_or_a_bad_reply(content, reasoning, finish, usage,
                                                                           model, index, text, chat):
    choice: dict[str, Any] = {"index": index, "finish_reason": finish}
    if chat:
        choice["message"] = {"content": content, "reasoning_content": reasoning}
    else:
        choice["text"] = text
    raw = RawResponse(200, encoded({"choices": [choice], "usage": usage, "model": model}))
    read = replies.read_chat if chat else replies.read_text
    try:
        done = read(raw, LIMITS, endpoint="http://e", latency_s=0.1, attempts=1)
    except replies.BadReply:
        return
    stored(done)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_a_bad_reply_or_a_completion(raw):
    try:
        stored(replies.read_chat(RawResponse(200, raw), LIMITS, endpoint="http://e", latency_s=0.1, attempts=1))
    except replies.BadReply:
        pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(values, values, values, values), max_size=12), st.binary(max_size=40))
def test_a_stream_of_any_chunks_ends_as_a_completion_a_bad_reply_or_oversized(chunks, junk):
    sink = replies.StreamAssembler(LIMITS)
    try:
        for content, finish, usage, index in chunks:
            payload = encoded({"choices": [{"index": index, "delta": {"content": content}, "finish_reason": finish}],
                               "usage": usage})
            if not sink(0.1, payload):
                break
        else:
            sink(0.2, junk)
        done = sink.completion(endpoint="http://e", latency_s=0.3, attempts=1)
    except (replies.BadReply, Oversized):
        return
    stored(done)
