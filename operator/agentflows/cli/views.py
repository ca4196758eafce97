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

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import click
import orjson
import pydantic

from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.api import times

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


def summary(run: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run as ``get -o json`` prints it (``status``: the run's, offloaded outputs read back)."""
    status = status if status is not None else (run.get("status") or {})
    return {
        "name": run["metadata"]["name"],
        "namespace": run["metadata"].get("namespace"),
        "flow": (run.get("spec") or {}).get("flow"),
        "phase": status.get("phase"),
        "reason": status.get("reason"),
        "message": status.get("message"),
        "attempt": status.get("attempt"),
        "startTime": status.get("startTime"),
        "completionTime": status.get("completionTime"),
        "output": status.get("output"),
        "usage": status.get("usage"),
        "nodes": status.get("nodes") or {},
        "requests": status.get("requests") or {},
    }


def dump(value: Any, output: str) -> str:
    """``value`` as JSON or YAML text."""
    if output == "yaml":
        import yaml

        text: str = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=100)
        return text.rstrip("\n")
    try:
        # the standard library indents in pure Python: 1.2 s for a run of 4,000 map items
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # what orjson does not take (an integer beyond 64 bits, a non-str key)
        return json.dumps(value, indent=2, ensure_ascii=False)


def pending_requests(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Requests of a run a human may decide (:func:`human_requests.decidable`), as written."""
    status = run.get("status") or {}
    try:
        typed = flowrun_api.FlowRunStatus.model_validate(status)
    except pydantic.ValidationError:
        return {}
    return {rid: status["requests"][rid] for rid in human_requests.decidable(typed)}


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


def render_run(info: dict[str, Any], output: str) -> str:
    """One run (a :func:`summary`) in an ``-o`` format."""
    if output in ("json", "yaml"):
        return dump(info, output)
    if output == "name":
        return str(info["name"])
    wide = output == "wide"
    where = f"{info['namespace']}/" if info.get("namespace") else ""
    head = f"{where}{info['name']}  flow {info['flow']}  phase {info['phase']}"
    if info.get("attempt") is not None:
        head += f"  attempt {info['attempt']}"
    lines = [head]
    if info.get("message"):
        lines.append(f"  {info['reason']}: {info['message']}")
    if wide:
        lines.append(f"  started {info.get('startTime') or NONE}")
        lines.append(f"  finished {info.get('completionTime') or NONE}")
        lines.append(f"  usage {_usage_text(info.get('usage'))}")
    for key, record in in_run_order(info["nodes"]):
        lines.append(_node_line(key, record, wide))
    for rid, request in sorted(info["requests"].items(), key=lambda r: flowrun_api.key_order(r[0])):
        state = request.get("decision") or "pending"
        line = f"  request {rid} ({request.get('kind')}): {request.get('message')} [{state}]"
        if wide:
            line += f" by {request.get('decidedBy')}" if request.get("decidedBy") else ""
            line += f" approvers {_approvers(request)}"
        lines.append(line)
    if info.get("output") is not None:
        lines.append("output: " + json.dumps(info["output"], ensure_ascii=False)[:4000])
    return "\n".join(lines)


def in_run_order(nodes: dict[str, Any]) -> list[tuple[str, Any]]:
    """Node records in the order they started (a skipped node: when it was skipped).

    The API server returns ``status.nodes`` with its keys sorted (``review#10`` before
    ``review#2``), a local run in the order written: both print as the run went, iterations of
    a loop in turn, ties (map items started together) by node and number.
    """
    last = dt.datetime.max.replace(tzinfo=dt.UTC)

    def started(item: tuple[str, Any]) -> tuple[dt.datetime, list[str | int]]:
        record = item[1] if isinstance(item[1], dict) else {}
        moment = times.parse_time(record.get("startedAt") or record.get("finishedAt"))
        return moment or last, flowrun_api.key_order(item[0])

    return sorted(nodes.items(), key=started)


def _node_line(key: str, record: dict[str, Any], wide: bool) -> str:
    took = ""
    started = times.parse_time(record.get("startedAt"))
    finished = times.parse_time(record.get("finishedAt"))
    if started is not None and finished is not None:
        took = f" {(finished - started).total_seconds():.2f}s"
    folded = flowrun_api.folded_range(key)
    if folded is not None:
        took = f"  {folded[2] - folded[1] + 1} iterations folded into one record"
    line = f"  {record.get('phase', '?'):<9} {key}{took}"
    if wide:
        line += f"  attempts {record.get('attempts', 0)}  usage {_usage_text(record.get('usage'))}"
    if record.get("error"):
        line += f"  error: {record['error']}"
    return line


def _usage_text(usage: dict[str, Any] | None) -> str:
    usage = usage or {}
    return (
        f"{usage.get('promptTokens', 0)}+{usage.get('completionTokens', 0)} tokens "
        f"${float(usage.get('costUSD', 0) or 0):.4f} {usage.get('llmCalls', 0)} llm "
        f"{usage.get('toolCalls', 0)} tool calls"
    )


def _approvers(request: dict[str, Any]) -> str:
    approvers = request.get("approvers") or {}
    names = [
        *(approvers.get("users") or []),
        *(f"group:{g}" for g in approvers.get("groups") or []),
    ]
    return ",".join(names) or "anyone"


# --- lists of runs ---------------------------------------------------------------------------

_RUN_COLUMNS = ("NAME", "FLOW", "PHASE", "NODE", "ATTEMPT", "DURATION", "TRIGGER", "AGE")
_RUN_WIDE = ("REASON", "REQUESTS", "MESSAGE")


def _run_row(run: dict[str, Any], wide: bool) -> tuple[str, ...]:
    """A run's cells under the printer columns of ``kubectl get flowruns``."""
    status = run.get("status") or {}
    trigger = (run.get("spec") or {}).get("trigger") or {}
    row: tuple[str, ...] = (
        run["metadata"]["name"],
        cell((run.get("spec") or {}).get("flow")),
        cell(status.get("phase")),
        cell(status.get("currentNode")),
        cell(status.get("attempt")),
        cell(status.get("duration")),
        cell(trigger.get("type")),
        times.age(run["metadata"].get("creationTimestamp")),
    )
    if wide:
        row += (
            cell(status.get("reason")),
            str(len(pending_requests(run))),
            cell(status.get("message")),
        )
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


def request_items(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pending request of the runs, as ``requests -o json`` prints them."""
    items = []
    for run in runs:
        for rid, request in pending_requests(run).items():
            items.append(
                {
                    "namespace": run["metadata"].get("namespace"),
                    "flow": (run.get("spec") or {}).get("flow"),
                    "run": run["metadata"]["name"],
                    "request": rid,
                    **request,
                }
            )
    return sorted(
        items, key=lambda i: (i["namespace"] or "", i["flow"] or "", i["run"], i["request"])
    )


def render_requests(items: list[dict[str, Any]], output: str, *, namespaces: bool) -> str:
    """Pending requests (:func:`request_items`) in an ``-o`` format."""
    if output in ("json", "yaml"):
        return dump(items, output)
    if output == "name":
        return "\n".join(f"{item['run']} {item['request']}" for item in items)
    wide = output == "wide"
    header = _REQUEST_COLUMNS + (_REQUEST_WIDE if wide else ())
    rows = []
    for item in items:
        row: tuple[str, ...] = (
            cell(item["flow"]),
            item["run"],
            item["request"],
            cell(item.get("kind")),
            cell(item.get("message")),
            cell(item.get("summary")),
            times.age(item.get("requestedAt")),
        )
        if wide:
            expires = item.get("expiresAt")
            row += (cell(item.get("node")), _approvers(item), expires or NONE)
        if namespaces:
            row = (item["namespace"] or NONE, *row)
        rows.append(row)
    return table(("NAMESPACE", *header) if namespaces else header, rows)
