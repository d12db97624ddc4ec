"""The circuit breaker's decisions (campaign/run/breaker.py): what it holds, what ends a streak, when it
trips, and what it gives back to be committed."""

from __future__ import annotations

import pytest

from harvest.campaign.run.breaker import Breaker, failure_key
from harvest.ledger import Failure

REJECT = "HTTP 400: stop: at most 4 stop strings"


def f(i: int, message: str = REJECT, error_class: str = "http_400") -> Failure:
    return Failure(f"i{i}", message, error_class)


def test_window_identical_failures_in_a_row_trip_it_and_nothing_is_given_back():
    b = Breaker(window=5)
    for i in range(4):
        assert b.holds("http_400") and b.failed(f(i)) == []
        assert not b.tripped
    assert b.failed(f(4)) == []
    assert b.tripped
    trip = b.trip
    assert trip.held == ("i0", "i1", "i2", "i3", "i4") and trip.error_class == "http_400"
    assert trip.message == REJECT and REJECT in trip.describe() and "5 requests in a row" in trip.describe()
    assert "[sampling]" in trip.advice
    # after the trip everything that still fails is held too (it goes back to pending); nothing is released
    assert b.failed(f(5)) == [] and b.succeeded() == [] and b.finish() == []
    assert [i for i, _ in b.held] == ["i0", "i1", "i2", "i3", "i4", "i5"]


def test_a_success_ends_the_streak_and_gives_the_held_failures_back():
    b = Breaker(window=3)
    b.failed(f(0))
    b.failed(f(1))
    released = b.succeeded()
    assert [x.item_id for x in released] == ["i0", "i1"] and b.held == []
    b.failed(f(2))
    b.failed(f(3))
    assert not b.tripped  # the streak started again at i2
    b.failed(f(4))
    assert b.tripped and b.trip.held == ("i2", "i3", "i4")


def test_another_message_or_class_starts_a_new_streak():
    b = Breaker(window=3)
    b.failed(f(0))
    b.failed(f(1))
    released = b.failed(f(2, "HTTP 404: The model `x` does not exist.", "http_404"))
    assert [x.item_id for x in released] == ["i0", "i1"]
    assert [i for i, _ in b.held] == ["i2"]
    assert [x.item_id for x in b.failed(f(3))] == ["i2"]
    assert not b.tripped


def test_numbers_in_messages_do_not_make_them_different():
    a = "HTTP 400: This model's maximum context length is 2048 tokens. However, you requested 2100 tokens"
    c = "HTTP 400: This model's maximum context length is 2048 tokens. However, you requested 9917 tokens"
    assert failure_key("http_400", a) == failure_key("http_400", c)
    assert failure_key("http_400", a) != failure_key("http_404", a)
    b = Breaker(window=2)
    b.failed(f(0, a))
    b.failed(f(1, c))
    assert b.tripped


def test_finish_gives_back_a_streak_shorter_than_the_window():
    b = Breaker(window=20)
    for i in range(7):
        b.failed(f(i))
    assert [x.item_id for x in b.finish()] == [f"i{i}" for i in range(7)]
    assert not b.tripped and b.held == []


@pytest.mark.parametrize("error_class", ["http_400", "http_401", "http_403", "http_404", "http_422",
                                         "context_overflow", "http_402", "http_405", "http_410", "http_413",
                                         "bad_reply", "oversized", "protocol", "redirect"])
def test_held_classes(error_class):
    assert Breaker(window=3).holds(error_class)


@pytest.mark.parametrize("error_class", ["http_500", "http_503", "request", "truncated", "empty", "http_4000"])
def test_other_classes_are_not_held(error_class):
    assert not Breaker(window=3).holds(error_class)


def test_window_zero_turns_it_off_and_a_negative_window_is_refused():
    assert not Breaker(window=0).holds("http_400")
    with pytest.raises(ValueError):
        Breaker(window=-1)


def test_a_redirect_trips_at_once_and_says_so():
    b = Breaker(window=20)
    assert b.failed(Failure("i0", "HTTP 307: the endpoint redirects to http://x/v1", "redirect")) == []
    assert b.tripped and b.trip is not None and b.trip.held == ("i0",)
    assert "(redirect)" in b.trip.describe() and "base_url" in b.trip.advice
