"""Request bodies and response parsing of the OpenAI-compatible wire format."""

from __future__ import annotations

import json

import pytest

from harvest.client import protocol, replies
from harvest.config import SamplingConfig
from harvest.transport import RawResponse

LIMITS = replies.limits_for({"max_tokens": 512}, replies.BYTES_PER_TOKEN, 100)


def test_base_body_leaves_out_unset_fields():
    body = protocol.base_body(SamplingConfig(), None)
    assert body == {"max_tokens": 512, "temperature": 0.0, "top_p": 1.0}


def test_overrides_none_removes_and_extra_body_merges_last():
    body = protocol.apply_overrides({"a": 1, "b": 2}, {"b": None, "c": 3, "extra_body": {"a": 9, "d": 4}})
    assert body == {"a": 9, "c": 3, "d": 4}


def test_encode_is_compact_utf8_and_refuses_nan_and_surrogates():
    assert protocol.encode({"t": "café"}) == '{"t":"café"}'.encode()
    with pytest.raises(ValueError):
        protocol.encode({"x": float("nan")})
    with pytest.raises(ValueError):
        protocol.encode({"x": "\udc80"})


def test_parse_chat_with_null_content_and_missing_usage():
    raw = json.dumps({"choices": [{"message": {"content": None, "reasoning_content": "only thoughts"},
                                   "finish_reason": "length"}]}).encode()
    done = replies.read_chat(RawResponse(200, raw), LIMITS, endpoint="http://x", latency_s=0.1, attempts=1)
    assert (done.text, done.reasoning_content, done.prompt_tokens, done.truncated) == ("", "only thoughts", None, True)


@pytest.mark.parametrize("raw", [b"not json", b"{}", b'{"choices": []}', b'{"choices": [{"text": "x"}]}',
                                 b'{"choices": [{"message": {"content": 5}}]}', b"[" * 100_000],
                         ids=["text", "empty", "no-choices", "text-choice", "content-int", "nested-deep"])
def test_parse_chat_rejects_what_is_not_a_chat_completion(raw):
    with pytest.raises(replies.BadReply):
        replies.read_chat(RawResponse(200, raw), LIMITS, endpoint="http://x", latency_s=0.1, attempts=1)


def test_first_model_id():
    assert replies.first_model_id(b'{"data": [{"id": "a"}, {"id": "b"}]}') == "a"
    assert replies.first_model_id(b'{"data": []}') is None
    assert replies.first_model_id(b"junk") is None
