"""What the pages show of a FlowRun: its row in the runs list, its nodes, its pending requests.

Shared by the server-rendered pages and the live events (:func:`row` is both a table row and
the JSON the script writes into it), for cluster runs and ``--local`` runs alike.
"""

from __future__ import annotations

from typing import Any

from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.api import times
from agentflows.console import markup

#: Columns of the runs table, and the row keys the script updates (``data-field``).
COLUMNS = (
    ("name", "Run"),
    ("namespace", "Namespace"),
    ("flow", "Flow"),
    ("phase", "Phase"),
    ("trigger", "Trigger"),
    ("started", "Started"),
    ("duration", "Duration"),
    ("pending", "Requests"),
    ("cost", "Cost"),
)


def key(run: dict[str, Any]) -> str:
    """``namespace/name`` (a local run has no namespace)."""
    meta = run.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def href(run: dict[str, Any]) -> str:
    """The run's detail page."""
    meta = run.get("metadata") or {}
    if meta.get("namespace"):
        return markup.path("runs", meta["namespace"], meta["name"])
    return markup.path("local", meta["name"])


def pending(run: dict[str, Any]) -> dict[str, flowrun_api.HumanRequest]:
    """The run's requests a human may decide (:func:`human_requests.decidable`)."""
    return human_requests.decidable_of(run)


def row(run: dict[str, Any], status: flowrun_api.FlowRunStatus | None = None) -> dict[str, str]:
    """The run's cells as text, keyed as :data:`COLUMNS`, plus ``key`` and ``href``.

    ``status``: the run's, when the caller has parsed it already.
    """
    meta, spec = run.get("metadata") or {}, run.get("spec") or {}
    status = status if status is not None else flowrun_api.status_of(run)
    cost = status.usage.cost_usd if status.usage else 0
    return {
        "key": key(run),
        "href": href(run),
        "name": str(meta.get("name") or ""),
        "namespace": str(meta.get("namespace") or ""),
        "flow": str(spec.get("flow") or ""),
        "phase": (status.phase or flowrun_api.RunPhase.PENDING).value,
        "trigger": str((spec.get("trigger") or {}).get("type") or "manual"),
        "started": str(status.start_time or meta.get("creationTimestamp") or ""),
        "duration": status.duration or "",
        "pending": str(len(human_requests.decidable(status)) or ""),
        "cost": f"${cost:.4f}" if cost else "",
    }


def row_html(cells: dict[str, str]) -> markup.Html:
    """A run's table row (its :func:`row`); cells carry ``data-field`` for live updates."""
    parts = []
    for field, _ in COLUMNS:
        if field == "name":
            body: Any = markup.link(cells["href"], cells["name"])
        elif field == "phase":
            body = markup.phase(cells["phase"])
        else:
            body = cells[field]
        parts.append(markup.tag("td", body, data_field=field))
    return markup.tag("tr", markup.join(parts), data_key=cells["key"])


def matches(run: dict[str, Any], phase: str | None, trigger: str | None) -> bool:
    """Whether the run passes the page's phase and trigger filters."""
    cells = row(run)
    return (not phase or cells["phase"] == phase) and (not trigger or cells["trigger"] == trigger)


def node_duration(record: flowrun_api.NodeStatus | None) -> str:
    """How long a node ran (so far, when it runs); nothing for a node with no record."""
    if record is None:
        return ""
    return times.duration(record.started_at, record.finished_at) or ""


def node_phases(run: dict[str, Any]) -> dict[str, Any]:
    """The live part of a run page: the run's phase and each node's phase and duration."""
    status = flowrun_api.status_of(run)
    return {
        "type": "run",
        "phase": (status.phase or flowrun_api.RunPhase.PENDING).value,
        "nodes": {
            node: {"phase": record.phase.value, "duration": node_duration(record)}
            for node, record in status.nodes.items()
        },
    }


def runs_table(runs: list[dict[str, Any]]) -> markup.Html:
    """The runs table, newest first."""
    ordered = sorted((row(r) for r in runs), key=lambda cells: cells["started"], reverse=True)
    header = [label for _, label in COLUMNS]
    return markup.table(header, [row_html(cells) for cells in ordered], id="runs")
