"""``metav1.Condition`` lists as the operator writes them into status.

Pure functions, used by every reconciler. A condition keeps its ``lastTransitionTime`` while its
status does not change, as kstatus and ``kubectl wait`` expect; times come from
:mod:`agentflows.api.times` (:func:`~agentflows.api.times.api_time`).
"""

from __future__ import annotations

from typing import Any

from agentflows.api import times


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
        "lastTransitionTime": times.api_time()
        if changed or previous is None
        else previous.get("lastTransitionTime", times.api_time()),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    others = [c for c in conditions if c.get("type") != type_]
    return sorted([*others, condition], key=lambda c: str(c.get("type")))
