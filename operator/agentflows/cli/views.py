"""What the CLI shows of runs, local or on a cluster, in every ``-o`` format.

Every command that shows runs (``run``, ``resume``, ``get``, ``list``, ``requests``, ``start
--wait``) works on FlowRun objects — read from the API server, or made from a local run's files
by :mod:`agentflows.cli.local_runs` — so a local run and a cluster run print the same shapes:

- ``-o json`` / ``-o yaml``: :func:`summary` of a run (``get``, ``run``), a list of them
  (``list``), a list of request objects (``requests``);
- ``-o name``: the run's name, one per line; ``requests -o name`` prints ``RUN REQUEST`` lines,
  ready for ``xargs -n2 agentflows approve``;
- ``-o table`` (the default but for ``run``) and ``-o wide``: the columns of ``kubectl get
  flowruns`` for lists, a block per run for ``get``; ``wide`` adds columns and details.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import click
import pydantic

from agentflows.api import common, times
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests

FORMATS = ("table", "wide", "json", "yaml", "name")
#: Phases a run never leaves.
#: A missing cell, as kubectl prints it.
NONE = "<none>"
#: Longest text shown in a table cell.
_CELL_CHARS = 60


def output_option(default: str = "table") -> Callable[[Any], Any]:
    """The ``-o/--output`` option of the commands that show runs."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(FORMATS),
        default=default,
        show_default=True,
        help="Output format: table, wide, json, yaml or name.",
    )


def summary(run: dict[str, Any], status: flowrun_api.FlowRunStatus | None = None) -> dict[str, Any]:
    """A run as ``get -o json`` prints it (``status``: the run's, offloaded outputs read back).

    Nodes, requests and usage are printed as written: the fields each record has, none added.
    """
    status = status if status is not None else flowrun_api.status_of(run)
    return {
        "name": run["metadata"]["name"],
        "namespace": run["metadata"].get("namespace"),
        "flow": (run.get("spec") or {}).get("flow"),
        "phase": status.phase.value if status.phase else None,
        "reason": status.reason,
        "message": status.message,
        # a local run has none; the operator writes 1 and up
        "attempt": status.attempt or None,
        "startTime": status.start_time,
        "completionTime": status.completion_time,
        "output": status.output,
        "usage": _written(status.usage),
        "nodes": {key: _written(record) for key, record in status.nodes.items()},
        "requests": {rid: _written(request) for rid, request in status.requests.items()},
    }


def _written(part: pydantic.BaseModel | None) -> Any:
    """A part of a status in its wire form, with the fields it was read with and no other."""
    if part is None:
        return None
    return part.model_dump(mode="json", by_alias=True, exclude_unset=True)


def dump(value: Any, output: str) -> str:
    """``value`` as JSON or YAML text."""
    if output == "yaml":
        import yaml

        text: str = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=100)
        return text.rstrip("\n")
    import orjson  # when a run is shown, after it ran: not on agentflows run's start path

    try:
        # the standard library indents in pure Python: 1.2 s for a run of 4,000 map items
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # what orjson does not take (an integer beyond 64 bits, a non-str key)
        return json.dumps(value, indent=2, ensure_ascii=False)


def pending_requests(run: dict[str, Any]) -> dict[str, flowrun_api.HumanRequest]:
    """Requests of a run a human may decide (:func:`human_requests.decidable`)."""
    return human_requests.decidable_of(run)


def cell(text: Any) -> str:
    """One line of at most ``_CELL_CHARS`` characters; ``<none>`` when empty."""
    if text is None or text == "":
        return NONE
    line = " ".join(str(text).split())
    return line if len(line) <= _CELL_CHARS else line[: _CELL_CHARS - 3] + "..."


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell, three spaces apart, as kubectl prints them."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


# --- one run ---------------------------------------------------------------------------------


def render_run(
    run: dict[str, Any], output: str, status: flowrun_api.FlowRunStatus | None = None
) -> str:
    """One run in an ``-o`` format (``status``: the run's, offloaded outputs read back)."""
    status = status if status is not None else flowrun_api.status_of(run)
    if output in ("json", "yaml"):
        return dump(summary(run, status), output)
    meta = run["metadata"]
    if output == "name":
        return str(meta["name"])
    wide = output == "wide"
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    phase = status.phase.value if status.phase else None
    head = f"{where}{meta['name']}  flow {(run.get('spec') or {}).get('flow')}  phase {phase}"
    if status.attempt:
        head += f"  attempt {status.attempt}"
    lines = [head]
    if status.message:
        lines.append(f"  {status.reason}: {status.message}")
    if wide:
        lines.append(f"  started {status.start_time or NONE}")
        lines.append(f"  finished {status.completion_time or NONE}")
        lines.append(f"  usage {_usage_text(status.usage)}")
    for key, record in in_run_order(status.nodes):
        lines.append(_node_line(key, record, wide))
    for rid, request in sorted(status.requests.items(), key=lambda r: flowrun_api.key_order(r[0])):
        state = request.decision.value if request.decision else "pending"
        line = f"  request {rid} ({request.kind.value}): {request.message} [{state}]"
        if wide:
            line += f" by {request.decided_by}" if request.decided_by else ""
            line += f" approvers {_approvers(request.approvers)}"
        lines.append(line)
    if status.output is not None:
        lines.append("output: " + json.dumps(status.output, ensure_ascii=False)[:4000])
    return "\n".join(lines)


def in_run_order(
    nodes: dict[str, flowrun_api.NodeStatus],
) -> list[tuple[str, flowrun_api.NodeStatus]]:
    """Node records in the order they started (a skipped node: when it was skipped).

    The API server returns ``status.nodes`` with its keys sorted (``review#10`` before
    ``review#2``), a local run in the order written: both print as the run went, iterations of
    a loop in turn, ties (map items started together) by node and number.
    """
    last = dt.datetime.max.replace(tzinfo=dt.UTC)

    def started(item: tuple[str, flowrun_api.NodeStatus]) -> tuple[dt.datetime, list[str | int]]:
        moment = times.parse_time(item[1].started_at or item[1].finished_at)
        return moment or last, flowrun_api.key_order(item[0])

    return sorted(nodes.items(), key=started)


def _node_line(key: str, record: flowrun_api.NodeStatus, wide: bool) -> str:
    took = ""
    started = times.parse_time(record.started_at)
    finished = times.parse_time(record.finished_at)
    if started is not None and finished is not None:
        took = f" {(finished - started).total_seconds():.2f}s"
    folded = flowrun_api.folded_range(key)
    if folded is not None:
        took = f"  {folded[2] - folded[1] + 1} iterations folded into one record"
    line = f"  {record.phase.value:<9} {key}{took}"
    if wide:
        line += f"  attempts {record.attempts}  usage {_usage_text(record.usage)}"
    if record.error:
        line += f"  error: {record.error}"
    return line


def _usage_text(usage: common.Usage | None) -> str:
    usage = usage or common.Usage()
    return (
        f"{usage.prompt_tokens}+{usage.completion_tokens} tokens "
        f"${usage.cost_usd:.4f} {usage.llm_calls} llm {usage.tool_calls} tool calls"
    )


def _approvers(approvers: common.Approvers) -> str:
    names = [*approvers.users, *(f"group:{g}" for g in approvers.groups)]
    return ",".join(names) or "anyone"


# --- lists of runs ---------------------------------------------------------------------------

_RUN_COLUMNS = ("NAME", "FLOW", "PHASE", "NODE", "ATTEMPT", "DURATION", "TRIGGER", "AGE")
_RUN_WIDE = ("REASON", "REQUESTS", "MESSAGE")


def _run_row(run: dict[str, Any], wide: bool) -> tuple[str, ...]:
    """A run's cells under the printer columns of ``kubectl get flowruns``."""
    status = flowrun_api.status_of(run)
    trigger = (run.get("spec") or {}).get("trigger") or {}
    row: tuple[str, ...] = (
        run["metadata"]["name"],
        cell((run.get("spec") or {}).get("flow")),
        cell(status.phase),
        cell(status.current_node),
        cell(status.attempt or None),  # a local run has none
        cell(status.duration),
        cell(trigger.get("type")),
        times.age(run["metadata"].get("creationTimestamp")),
    )
    if wide:
        pending = human_requests.decidable(status)
        row += (cell(status.reason), str(len(pending)), cell(status.message))
    return row


def render_runs(runs: list[dict[str, Any]], output: str, *, namespaces: bool) -> str:
    """Runs (FlowRun objects) in an ``-o`` format; ``namespaces`` adds a NAMESPACE column."""
    ordered = sorted(runs, key=lambda r: (r["metadata"].get("namespace") or "", _started(r)))
    if output in ("json", "yaml"):
        return dump([summary(run) for run in ordered], output)
    if output == "name":
        return "\n".join(run["metadata"]["name"] for run in ordered)
    wide = output == "wide"
    header = _RUN_COLUMNS + (_RUN_WIDE if wide else ())
    rows = [_run_row(run, wide) for run in ordered]
    if namespaces:
        header = ("NAMESPACE", *header)
        rows = [
            (run["metadata"].get("namespace") or NONE, *row)
            for run, row in zip(ordered, rows, strict=True)
        ]
    return table(header, rows)


def _started(run: dict[str, Any]) -> dt.datetime:
    moment = times.parse_time(run["metadata"].get("creationTimestamp"))
    return moment or dt.datetime.min.replace(tzinfo=dt.UTC)


# --- pending requests ------------------------------------------------------------------------

_REQUEST_COLUMNS = ("FLOW", "RUN", "REQUEST", "KIND", "MESSAGE", "SUMMARY", "AGE")
_REQUEST_WIDE = ("NODE", "APPROVERS", "EXPIRES")


@dataclasses.dataclass(frozen=True)
class PendingRequest:
    """A request a human may decide, with the run it belongs to."""

    namespace: str | None
    flow: str | None
    run: str
    id: str
    request: flowrun_api.HumanRequest

    def to_json(self) -> dict[str, Any]:
        """As ``requests -o json`` prints it: where it is, then the request as written."""
        where = {"namespace": self.namespace, "flow": self.flow, "run": self.run}
        return {**where, "request": self.id, **_written(self.request)}


def request_items(runs: list[dict[str, Any]]) -> list[PendingRequest]:
    """Every pending request of the runs, in the order ``requests`` prints them."""
    items = [
        PendingRequest(
            run["metadata"].get("namespace"),
            (run.get("spec") or {}).get("flow"),
            run["metadata"]["name"],
            rid,
            request,
        )
        for run in runs
        for rid, request in pending_requests(run).items()
    ]
    return sorted(items, key=lambda i: (i.namespace or "", i.flow or "", i.run, i.id))


def render_requests(items: list[PendingRequest], output: str, *, namespaces: bool) -> str:
    """Pending requests (:func:`request_items`) in an ``-o`` format."""
    if output in ("json", "yaml"):
        return dump([item.to_json() for item in items], output)
    if output == "name":
        return "\n".join(f"{item.run} {item.id}" for item in items)
    wide = output == "wide"
    header = _REQUEST_COLUMNS + (_REQUEST_WIDE if wide else ())
    rows = []
    for item in items:
        request = item.request
        row: tuple[str, ...] = (
            cell(item.flow),
            item.run,
            item.id,
            cell(request.kind),
            cell(request.message),
            cell(request.summary),
            times.age(request.requested_at),
        )
        if wide:
            row += (cell(request.node), _approvers(request.approvers), request.expires_at or NONE)
        if namespaces:
            row = (item.namespace or NONE, *row)
        rows.append(row)
    return table(("NAMESPACE", *header) if namespaces else header, rows)
