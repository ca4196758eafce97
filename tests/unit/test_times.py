"""``agentflows.api.times``, the one owner of time: the forms written, parsed back, durations."""

from __future__ import annotations

import datetime as dt

import pytest

from agentflows.api import times

MOMENT = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def test_records_are_written_with_microseconds_and_api_times_with_whole_seconds() -> None:
    assert times.timestamp(MOMENT) == "2026-01-02T03:04:05.678901Z"
    assert times.api_time(MOMENT) == "2026-01-02T03:04:05Z"
    later = MOMENT + dt.timedelta(microseconds=1)
    assert times.timestamp(MOMENT) < times.timestamp(later)  # one writer's times sort as text


def test_both_forms_read_back_as_the_same_aware_time() -> None:
    assert times.parse_time(times.timestamp(MOMENT)) == MOMENT
    assert times.parse_time(times.api_time(MOMENT)) == MOMENT.replace(microsecond=0)
    assert times.parse_time("2026-01-02T03:04:05+01:00") == MOMENT.replace(hour=2, microsecond=0)


@pytest.mark.parametrize("text", [None, "", "yesterday", "2026-13-40T00:00:00Z"])
def test_no_time_or_text_that_is_not_one_reads_as_none(text: str | None) -> None:
    assert times.parse_time(text) is None


def test_a_time_without_a_zone_is_taken_as_utc() -> None:
    assert times.parse_time("2026-01-02T03:04:05") == MOMENT.replace(microsecond=0)


def test_durations_between_recorded_times_and_ages() -> None:
    start = times.api_time(MOMENT)
    assert times.duration(start, times.api_time(MOMENT + dt.timedelta(seconds=3723))) == "1h2m3s"
    assert times.elapsed(start, times.api_time(MOMENT + dt.timedelta(seconds=61))) == 61.0
    assert times.duration(None, start) is None and times.elapsed("", start) is None
    assert times.format_duration(-5) == "0s"
    at = MOMENT + dt.timedelta(days=2, hours=5)
    assert times.age(start, at) == "2d"
    assert times.age(start, MOMENT + dt.timedelta(seconds=59)) == "59s"
    assert times.age("not a time", at) == "?"
