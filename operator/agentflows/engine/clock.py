"""Time for the engine: the clock a host may inject, and the RFC 3339 form runs record.

The engine never reads the system time directly: a run takes a :data:`Clock` (default
:func:`utc_now`) so request expiry and run deadlines follow the host's notion of now. Callers
that only format or parse recorded times use :func:`timestamp` and :func:`parse_time`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

#: Returns the current time, timezone-aware.
Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    """The current time in UTC (the default clock)."""
    return dt.datetime.now(dt.UTC)


def timestamp(moment: dt.datetime | None = None) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times (now when no moment is given)."""
    return (moment or utc_now()).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> dt.datetime:
    """Parse an RFC 3339 time written by :func:`timestamp` or Kubernetes."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
