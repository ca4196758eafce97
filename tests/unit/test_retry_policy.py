"""The one retry policy (api/retry.py): delays, caps, jitter, bounds, and the status table."""

from __future__ import annotations

import datetime
import math

import pytest

from agentflows.api import retry


def test_delays_grow_by_the_factor_up_to_the_cap_without_jitter() -> None:
    policy = retry.Backoff(initial=0.5, factor=2, cap=8)
    assert [policy.delay(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 8, 8]
    assert [retry.Backoff(initial=3, factor=1).delay(n) for n in (1, 5)] == [3, 3]


def test_a_delay_far_along_stays_at_the_cap_instead_of_overflowing() -> None:
    assert retry.Backoff(initial=0.5, cap=60).delay(5000) == 60
    assert retry.Backoff(initial=0.5).delay(5000) == math.inf
    assert retry.Backoff(initial=0, cap=60).delay(5000) == 0


def test_jitter_only_shortens_a_delay_by_at_most_its_share() -> None:
    policy = retry.Backoff(initial=2, cap=10, jitter=0.5)
    delays = [policy.delay(4) for _ in range(200)]
    assert all(5 <= d <= 10 for d in delays) and len(set(delays)) > 1
    full = [retry.Backoff(initial=1, jitter=1).delay(1) for _ in range(200)]
    assert all(0 <= d <= 1 for d in full)


def test_a_delay_from_the_time_failing_doubles_as_each_wait_equals_those_before() -> None:
    policy = retry.Backoff(initial=5, cap=60)
    waited, waits = 0.0, []
    for _ in range(6):
        waits.append(policy.delay_since(waited))
        waited += waits[-1]
    assert waits == [5, 5, 10, 20, 40, 60]
    assert policy.delay_since(-3) == 5  # a clock that went back waits the first delay


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tries_give_up_when_the_attempts_are_spent() -> None:
    tries = retry.Backoff(initial=1, attempts=3).tries()
    assert [tries.failed(), tries.failed(), tries.failed()] == [1, 2, None]
    assert tries.failures == 3
    assert retry.Backoff(initial=1, attempts=1).tries().failed() is None


def test_tries_give_up_when_the_next_wait_would_end_after_the_deadline() -> None:
    clock = FakeClock()
    tries = retry.Backoff(initial=1, cap=4, deadline=10).tries(clock)
    delays = []
    while (delay := tries.failed()) is not None:
        delays.append(delay)
        clock.now += delay
    assert delays == [1, 2, 4] and clock.now == 107  # a wait of 4 more would end at 111


def test_a_reset_after_a_success_starts_the_delays_and_the_deadline_again() -> None:
    clock = FakeClock()
    tries = retry.Backoff(initial=1, deadline=5).tries(clock)
    assert [tries.failed(), tries.failed()] == [1, 2]
    clock.now += 60
    tries.reset()
    assert tries.failures == 0 and tries.failed() == 1


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("initial", -1, "0 or more seconds"),
        ("factor", 0.5, "1 or more"),
        ("jitter", 1.5, "between 0 and 1"),
        ("attempts", 0, "1 or more, or None"),
        ("deadline", -1, "0 or more, or None"),
    ],
)
def test_a_bad_policy_names_the_field_and_what_is_valid(
    field: str, value: float, valid: str
) -> None:
    with pytest.raises(ValueError, match=f"Backoff.{field}: {value}; must be {valid}"):
        retry.Backoff(**{"initial": 1, field: value})


@pytest.mark.parametrize(
    ("status", "may_help", "model_may_help"),
    [
        (400, False, False),
        (401, False, False),
        (403, False, False),
        (404, False, False),
        (408, True, True),
        (409, False, True),
        (410, False, False),
        (422, False, False),
        (425, True, True),
        (429, True, True),
        (500, True, True),
        (502, True, True),
        (503, True, True),
        (504, True, True),
    ],
)
def test_which_http_statuses_a_retry_may_get_past(
    status: int, may_help: bool, model_may_help: bool
) -> None:
    assert retry.status_may_help(status) is may_help
    assert retry.status_may_help(status, conflict_passes=True) is model_may_help


def test_a_loop_that_never_gives_up_still_counts_and_grows_its_delays() -> None:
    tries = retry.Backoff(initial=1, cap=30, attempts=1).tries()
    assert [tries.next_delay() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert tries.failures == 7


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 3 ", 3.0),
        ("Wed, 02 Dec 2026 12:00:30 GMT", 30.0),
        ("Wed, 02 Dec 2026 11:00:00 GMT", 0.0),
        (None, None),
        ("-5", None),
        ("soon", None),
        ("Wed, 02 Dec 2026 12:00:30", None),
    ],
)
def test_retry_after_reads_delta_seconds_and_http_dates(
    header: str | None, seconds: float | None
) -> None:
    noon = datetime.datetime(2026, 12, 2, 12, 0, 0, tzinfo=datetime.UTC).timestamp()
    assert retry.retry_after(header, now=noon) == seconds


def test_a_failure_waits_at_least_what_the_other_side_asked_and_never_past_the_deadline() -> None:
    clock = [0.0]
    tries = retry.Backoff(initial=0.2, cap=5, deadline=10).tries(lambda: clock[0])
    assert tries.failed(at_least=3.0) == 3.0
    assert tries.failed(at_least=0.1) == 0.4
    assert tries.failed(at_least=11.0) is None


def test_a_retrys_log_line_names_the_wait_asked_only_when_one_was_asked() -> None:
    assert retry.retry_after_note(2.0) == " (Retry-After: 2s)"
    assert retry.retry_after_note(0.5) == " (Retry-After: 0.5s)"
    assert retry.retry_after_note(None) == ""
