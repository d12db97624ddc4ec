"""The one door for answers (client/replies.py): what real engines send is read, the rest refused
with a reason, and nothing an endpoint sends can break what harvest stores or shows."""

from __future__ import annotations

import json
import math

import pytest

from harvest.client import replies
from harvest.client.replies import BadReply, StreamAssembler, limits_for, read_chat, read_text
from harvest.ledger.handle import dumps
from harvest.transport import Oversized, RawResponse

MAX = 16
LIMITS = limits_for({"max_tokens": MAX}, replies.BYTES_PER_TOKEN, 100)


def chat(choice: dict, usage: object = None, **top: object) -> RawResponse:
    body = {"choices": [{"index": 0, **choice}], **top}
    if usage is not None:
        body["usage"] = usage
    return RawResponse(200, json.dumps(body, allow_nan=True).encode())


def read(response: RawResponse, limits: replies.ReplyLimits = LIMITS):
    return read_chat(response, limits, endpoint="http://e", latency_s=0.1, attempts=1)


def stored(completion) -> None:
    """What the ledger stores of it encodes (UTF-8, JSON) and holds no number out of range."""
    turn = {"text": completion.text, "reasoning": completion.reasoning_content,
            "finish_reason": completion.finish_reason, "sent": completion.finish_reason_sent,
            "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens}
    dumps(turn).encode("utf-8")
    for key in ("prompt_tokens", "completion_tokens"):
        assert turn[key] is None or (type(turn[key]) is int and 0 <= turn[key] < 2**31), turn


def test_content_as_text_parts_is_read_as_its_text():
    done = read(chat({"message": {"content": [{"type": "text", "text": "Hello, "}, {"type": "image_url"},
                                              {"type": "text", "text": "world"}]}, "finish_reason": "stop"}))
    assert done.text == "Hello, world" and done.finish_reason == "stop"


@pytest.mark.parametrize("value", [10**30, "abc", 1e308, float("nan"), float("inf"), -5, True, 3.5, [1], {"a": 1}])
def test_a_token_count_out_of_range_or_of_another_type_is_unknown(value):
    done = read(chat({"message": {"content": "hi"}, "finish_reason": "stop"},
                     {"prompt_tokens": value, "completion_tokens": value}))
    assert (done.prompt_tokens, done.completion_tokens) == (None, None)
    stored(done)


@pytest.mark.parametrize("usage", ["abc", [1, 2], 7, None])
def test_a_usage_of_another_type_is_unknown(usage):
    done = read(chat({"message": {"content": "hi"}, "finish_reason": "stop"}, usage))
    assert (done.text, done.prompt_tokens, done.completion_tokens) == ("hi", None, None)


@pytest.mark.parametrize("sent, tokens, reason, recorded", [
    ({}, 3, None, "{}"),                          # another type, under the limit: no reason, what came kept
    ({}, MAX, "length", "{}"),                    # at the limit: truncated
    (None, MAX, "length", ""),                     # none sent, at max_tokens: truncated, never done
    ("", MAX, "length", ""),
    ("abort", MAX, "length", "abort"),             # unknown: the numbers decide
    ("abort", 3, "abort", None),
    ({"type": "length", "length": MAX}, 3, "length", '{"type": "length", "length": 16}'),  # SGLang's shape
    ("stop", MAX, "stop", None),                   # the engine's own word stands
    (12, 3, None, "12"),
])
def test_finish_reason_missing_or_unknown_is_decided_by_the_token_count(sent, tokens, reason, recorded):
    done = read(chat({"message": {"content": "hi"}, "finish_reason": sent}, {"completion_tokens": tokens}))
    assert (done.finish_reason, done.finish_reason_sent, done.truncated) == (reason, recorded, reason == "length")
    stored(done)


def test_without_usage_the_answers_own_tokens_decide():
    content = [{"token": "a", "logprob": -0.1}] * MAX
    done = read(chat({"message": {"content": "a" * MAX}, "logprobs": {"content": content}}))
    assert done.truncated and done.completion_tokens == MAX


def test_a_lone_surrogate_and_bytes_that_are_not_utf8_are_replaced_and_counted():
    raw = (b'{"choices": [{"message": {"content": "a\\ud800b\\udfff", "reasoning_content": "r\xff"},'
           b' "finish_reason": "stop"}], "model": "m\\udc80"}')
    done = read(RawResponse(200, raw))
    assert done.text == "a\ufffdb\ufffd" and done.reasoning_content == "r\ufffd" and done.model == "m\ufffd"
    assert done.replaced == 4
    stored(done)
    pair = read(RawResponse(200, b'{"choices": [{"message": {"content": "\\ud83d\\ude00"}}]}'))
    assert pair.text == "\U0001F600" and pair.replaced == 0  # a real pair is one character, nothing replaced


@pytest.mark.parametrize("raw, why", [
    (b"<html>502 Bad Gateway</html>", "is not JSON"),
    (b"{}", "choices: Field required"),
    (b'{"choices": []}', "choices: List should have at least 1 item"),
    (b'{"choices": [{"message": {"content": 5}}]}', "choices.0.message.content"),
    (b'{"choices": [{"message": {"content": "x", "reasoning_content": {"a": 1}}}]}', "reasoning_content"),
    (b"[" * 200_000, "is not JSON"),
], ids=["html", "empty", "no-choices", "content-int", "reasoning-dict", "nested-deep"])
def test_what_is_not_a_chat_completion_is_refused_naming_why(raw, why):
    with pytest.raises(BadReply, match="the answer") as caught:
        read(RawResponse(200, raw))
    assert why in str(caught.value)


def test_a_text_completion_with_a_null_text_is_empty_and_the_model_name_is_cut():
    raw = json.dumps({"model": "m" * 10_000, "choices": [{"text": None, "finish_reason": None}],
                      "usage": {"completion_tokens": MAX}}).encode()
    done = read_text(RawResponse(200, raw), LIMITS, endpoint="http://e", latency_s=0.1, attempts=1)
    assert (done.text, done.finish_reason, done.finish_reason_sent) == ("", "length", "")
    assert len(done.model or "") == 256


def test_the_cap_grows_with_max_tokens_n_and_logprobs_and_has_a_floor():
    plain = limits_for({"max_tokens": 512}, 64, 100)
    assert plain.body_bytes == replies.BASE_BYTES + 512 * 64 and plain.events > 512
    assert limits_for({"max_tokens": 512, "n": 4}, 64, 100).body_bytes == replies.BASE_BYTES + 4 * 512 * 64
    with_lp = limits_for({"max_tokens": 512, "logprobs": True, "top_logprobs": 5}, 64, 100)
    assert with_lp.body_bytes == replies.BASE_BYTES + 512 * 64 * (1 + 4 * 6)
    text_lp = limits_for({"max_tokens": 512, "logprobs": 5}, 64, 100)  # /v1/completions: logprobs = k
    assert text_lp.body_bytes == with_lp.body_bytes
    assert limits_for({"max_tokens": 512, "prompt_logprobs": 0}, 64, 1000).body_bytes > plain.body_bytes + 1000
    unset = limits_for({}, 64, 100)
    assert unset.max_tokens is None and unset.body_bytes == replies.BASE_BYTES + replies.UNKNOWN_MAX_TOKENS * 64
    assert limits_for({"max_tokens": 512}, 128, 100).body_bytes == replies.BASE_BYTES + 512 * 128


def event(**choice: object) -> bytes:
    return json.dumps({"choices": [{"index": 0, **choice}]}).encode()


def test_a_stream_is_cut_past_max_tokens_and_the_answer_is_truncated():
    sink = StreamAssembler(LIMITS)
    fed = 0
    while sink(0.01 * fed, event(delta={"content": "tok "})):
        fed += 1
        assert fed < 10 * MAX
    assert sink.cut and fed == LIMITS.events
    done = sink.completion(endpoint="http://e", latency_s=1.0, attempts=1)
    assert done.truncated and done.text == "tok " * (fed + 1) and done.completion_tokens == fed + 1
    assert done.ttft_s == 0.0 and done.tpot_s is not None and math.isfinite(done.tpot_s)


def test_a_stream_keeps_no_more_text_than_its_cap_and_no_endless_empty_events():
    small = limits_for({"max_tokens": 4}, 8, 10)
    sink = StreamAssembler(small)
    with pytest.raises(Oversized, match="streamed text"):
        for _ in range(10):
            sink(0.0, event(delta={"content": "x" * (small.body_bytes // 3)}))
    empty = StreamAssembler(small)
    with pytest.raises(Oversized, match="events"):
        for _ in range(100_000):
            empty(0.0, event(delta={}))


def test_a_stream_event_that_is_no_chunk_or_an_error_stops_it_with_the_reason():
    sink = StreamAssembler(LIMITS)
    assert sink(0.0, event(delta={"content": "a"}))
    assert not sink(0.0, b'{"error": {"message": "engine crashed"}}')
    with pytest.raises(BadReply, match="engine crashed"):
        sink.completion(endpoint="http://e", latency_s=1.0, attempts=1)
    other = StreamAssembler(LIMITS)
    assert not other(0.0, b"not json")
    with pytest.raises(BadReply, match="a streamed event is not JSON"):
        other.completion(endpoint="http://e", latency_s=1.0, attempts=1)


def test_a_streamed_lone_surrogate_is_replaced_and_counted():
    sink = StreamAssembler(LIMITS)
    assert sink(0.0, b'{"choices": [{"index": 0, "delta": {"content": "a\\ud800"}}]}')
    assert sink(0.1, b'{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
                     b'"usage": {"completion_tokens": "abc"}}')
    done = sink.completion(endpoint="http://e", latency_s=1.0, attempts=1)
    assert (done.text, done.replaced, done.finish_reason, done.completion_tokens) == ("a\ufffd", 1, "stop", 1)
    stored(done)


def test_model_lists_of_odd_shapes_are_no_list():
    assert replies.model_ids(b'{"data": [{"id": "a"}, {"id": 7}, {"x": 1}]}') == ("a", "7")
    assert replies.model_ids(b'{"data": "a"}') is None
    assert replies.model_ids(b"SSH-2.0-OpenSSH") is None
    assert replies.loads(b"[" * 100_000) is None and replies.loads(b'{"a": NaN}') is not None
