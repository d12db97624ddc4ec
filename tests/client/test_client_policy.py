"""Status classes, backoff, Retry-After and server error messages."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from harvest.client.policy import (
    MAX_RETRY_AFTER_S,
    backoff_delay,
    classify_status,
    error_message,
    parse_retry_after,
    redact,
)
from harvest.client.records import FailureKind


@pytest.mark.parametrize("status, kind", [
    (200, None), (201, None), (400, FailureKind.REJECTED), (401, FailureKind.REJECTED),
    (404, FailureKind.REJECTED), (422, FailureKind.REJECTED), (408, FailureKind.BUSY), (409, FailureKind.BUSY),
    (425, FailureKind.BUSY), (429, FailureKind.BUSY), (500, FailureKind.SERVER_ERROR),
    (503, FailureKind.SERVER_ERROR), (599, FailureKind.SERVER_ERROR), (302, FailureKind.REDIRECT), (307, FailureKind.REDIRECT),
])
def test_classify_status(status, kind):
    assert classify_status(status) is kind


def test_backoff_doubles_within_equal_jitter_and_stops_at_the_cap():
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(8.0, 0.25 * 2 ** (attempt - 1))
        delays = [backoff_delay(attempt, base=0.25, cap=8.0, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 4  # really jittered


def test_retry_after_seconds_date_and_garbage():
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(format_datetime(now + timedelta(seconds=20), usegmt=True), now=now) == 20.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=20), usegmt=True), now=now) == 0.0
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("86400") == MAX_RETRY_AFTER_S
    for bad in (None, "", "soon", "nan"):
        assert parse_retry_after(bad) is None


@pytest.mark.parametrize("body, expected", [
    (b'{"error": {"message": "context too long", "type": "BadRequestError"}}', "context too long"),
    (b'{"object": "error", "message": "sglang says no", "code": 400}', "sglang says no"),
    (b'{"error": "plain error string"}', "plain error string"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b'{"detail": [{"loc": ["body", "max_tokens"], "msg": "must be positive"}]}', "body.max_tokens: must be positive"),
    (b"Internal Server Error", "Internal Server Error"),
    (b"", "Bad Request"),
    (b'{"unexpected": 1}', '{"unexpected": 1}'),
    (b"\xff\xfe broken utf8", "\ufffd\ufffd broken utf8"),
])
def test_error_message_reads_the_usual_shapes(body, expected):
    assert error_message(400, body) == expected


def test_error_message_is_bounded():
    assert len(error_message(400, b"x" * 100_000)) < 2100


def test_redact():
    assert redact("key sk-1 and sk-1 again", "sk-1") == "key *** and *** again"
    assert redact("nothing", None) == "nothing"
