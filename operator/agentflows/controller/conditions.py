"""Timestamps and ``metav1.Condition`` lists as the operator writes them into status.

Pure functions, used by every reconciler. A condition keeps its ``lastTransitionTime`` while its
status does not change, as kstatus and ``kubectl wait`` expect.
"""

from __future__ import annotations

import datetime
from typing import Any


def now() -> datetime.datetime:
    """The current time in UTC."""
    return datetime.datetime.now(datetime.UTC)


def timestamp(moment: datetime.datetime | None = None) -> str:
    """RFC 3339 with seconds, as Kubernetes writes times: ``2026-01-02T03:04:05Z``."""
    return (moment or now()).astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    """Parse an RFC 3339 time (with or without fractions); None for None or garbage."""
    if not text:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


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


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str = "",
    *,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Return ``conditions`` with ``type_`` set; the transition time moves only on a change."""
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != status
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": timestamp()
        if changed or previous is None
        else previous.get("lastTransitionTime", timestamp()),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    others = [c for c in conditions if c.get("type") != type_]
    return sorted([*others, condition], key=lambda c: str(c.get("type")))


def condition_of(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The condition of that type, or None."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)
