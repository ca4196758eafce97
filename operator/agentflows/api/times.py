"""Time: now, the RFC 3339 text agentflows writes, reading it back, and durations — the one owner.

Every package formats and parses times here (the engine, the operator, the runner, the
triggers, the CLI and the console), so a recorded time reads back the same everywhere.

- :func:`now` is a timezone-aware UTC datetime; the engine takes a :data:`Clock` (default
  :func:`now`) so request expiry and run deadlines follow the host's notion of now.
- :func:`timestamp` is the form agentflows records (node and run records, requests, sessions,
  Leases, runner log lines): UTC, microseconds and a ``Z``, as ``metav1.MicroTime``, so times
  of one writer sort as text. :func:`api_time` is whole seconds, as Kubernetes writes
  ``metav1.Time``: the operator's status times and conditions, Events, and the window starts and
  scheduled times users read and match on (``2026-01-01T02:00:00Z``).
- :func:`parse_time` reads either form (and any RFC 3339 time): None for no text or text that
  is not a time, never an exception, and a time without a zone is taken as UTC.
- :func:`elapsed` and :func:`duration` between two recorded times, :func:`format_duration`
  (``1h2m3s``, as kubectl) and :func:`age` (``45s``, ``3h``, ``2d``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

#: Returns the current time, timezone-aware.
Clock = Callable[[], dt.datetime]


def now() -> dt.datetime:
    """The current time in UTC (the default clock)."""
    return dt.datetime.now(dt.UTC)


#: :func:`timestamp`'s form: ``2026-01-02T03:04:05.000006Z``.
_STAMP = "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ"


def timestamp(moment: dt.datetime | None = None) -> str:
    """RFC 3339 in UTC with microseconds and a Z (now when no moment is given)."""
    # The fields by %-formatting: isoformat's text (which would end "+00:00" rather than "Z")
    # in less than half its time, a third of strftime's; the engine stamps every node record
    # twice (issue 25: engine overhead per node).
    u = (moment or now()).astimezone(dt.UTC)
    return _STAMP % (u.year, u.month, u.day, u.hour, u.minute, u.second, u.microsecond)


def api_time(moment: dt.datetime | None = None) -> str:
    """RFC 3339 in UTC with whole seconds, as Kubernetes writes times: ``2026-01-02T03:04:05Z``."""
    return (moment or now()).astimezone(dt.UTC).isoformat(timespec="seconds")[:-6] + "Z"


def parse_time(text: str | None) -> dt.datetime | None:
    """Parse an RFC 3339 time (with or without fractions); None for None, "" or not a time."""
    if not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def format_duration(seconds: float) -> str:
    """``1h2m3s`` style, like kubectl: whole seconds, leading zero units dropped."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def elapsed(started: str | None, finished: str | None = None) -> float | None:
    """Seconds from ``started`` to ``finished`` (now when not finished); None without a start."""
    begin = parse_time(started)
    if begin is None:
        return None
    return ((parse_time(finished) or now()) - begin).total_seconds()


def duration(started: str | None, finished: str | None = None) -> str | None:
    """:func:`elapsed` as :func:`format_duration` text; None without a start."""
    seconds = elapsed(started, finished)
    return None if seconds is None else format_duration(seconds)


def age(text: str | None, at: dt.datetime | None = None) -> str:
    """Short age of a recorded time at ``at`` (now): 45s, 12m, 3h, 2d; ``?`` for no time."""
    moment = parse_time(text)
    if moment is None:
        return "?"
    seconds = ((at or now()) - moment).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
