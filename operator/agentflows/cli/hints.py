"""The commands the CLI prints when a run waits: one complete command per choice.

Each command is shell-quoted (:func:`shlex.join`) so pasting it runs exactly that decision —
never ``--decision approve|reject``, which a shell reads as a pipe into ``reject`` after
approving. The choices of a request are the decisions its kind takes
(``flowrun.DECISIONS``): approve and reject, ``--data`` for an input request (with an example
made from its schema, to edit before running), ``--edits`` when a proposal can be edited. A
local run is decided with ``agentflows resume`` (:func:`commands`), a FlowRun with ``approve``,
``reject`` or ``respond`` (:func:`cluster_commands`).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from agentflows.api import flowrun as flowrun_api

Decision = flowrun_api.Decision
#: How deep :func:`example` follows nested schemas before writing a placeholder.
_MAX_DEPTH = 6
#: The order choices are printed in.
_ORDER = (Decision.APPROVE, Decision.RESPOND, Decision.EDIT, Decision.REJECT)


def choices(request: flowrun_api.HumanRequest) -> list[tuple[Decision, Any]]:
    """The decisions to offer for a request, each with its JSON payload (data, edits or None)."""
    kind = request.kind
    if _client_calls(request.proposal):
        # the caller runs a client tool: its result is the answer, nothing runs on approve
        return [(Decision.RESPOND, "<result>"), (Decision.REJECT, None)]
    allowed = flowrun_api.DECISIONS.get(kind, frozenset(Decision))
    offered: list[tuple[Decision, Any]] = []
    for decision in _ORDER:
        if decision not in allowed:
            continue
        if decision == Decision.RESPOND:
            if kind == flowrun_api.RequestKind.INPUT:
                offered.append((decision, example(request.schema_)))
        elif decision == Decision.EDIT:
            edits = _proposed_arguments(request.proposal)
            if edits is not None:
                offered.append((decision, edits))
        else:
            offered.append((decision, None))
    return offered


def commands(
    run: str, request_id: str, request: flowrun_api.HumanRequest, state_dir: str | None
) -> list[tuple[str, str]]:
    """``(choice, command)`` for each way to decide a pending request of a local run."""
    base = ["agentflows", "resume", run, "--request", request_id]
    if state_dir is not None:
        base += ["--state-dir", state_dir]
    lines = []
    for decision, payload in choices(request):
        if decision == Decision.RESPOND:
            words = [*base, "--data", _json(payload)]
        elif decision == Decision.EDIT:
            words = [*base, "--decision", "edit", "--edits", _json(payload)]
        else:
            words = [*base, "--decision", decision.value]
        lines.append((decision.value, shlex.join(words)))
    return lines


def cluster_commands(
    run: str, request_id: str, request: flowrun_api.HumanRequest, namespace: str
) -> list[tuple[str, str]]:
    """``(choice, command)`` for each way to decide a pending request of a FlowRun."""
    where = [run, request_id, "-n", namespace]
    lines = []
    for decision, payload in choices(request):
        if decision == Decision.RESPOND:
            words = ["agentflows", "respond", *where, "--data", _json(payload)]
        elif decision == Decision.EDIT:
            words = ["agentflows", "approve", *where, "--edits", _json(payload)]
        else:
            words = ["agentflows", decision.value, *where]
        lines.append((decision.value, shlex.join(words)))
    return lines


def describe(
    run: str,
    request_id: str,
    request: flowrun_api.HumanRequest,
    commands: list[tuple[str, str]],
) -> str:
    """What a waiting run prints for one request: the question, then a command per choice."""
    lines = [
        f"run {run} waits for request {request_id!r} ({request.kind.value}): {request.message}"
    ]
    proposal = request.proposal
    if isinstance(proposal, dict) and _client_calls(proposal):
        # the caller needs the arguments to run the tool (or, for ask_user, to see the question)
        lines += [f"  {c.get('tool')} {_json(c.get('args'))}" for c in proposal["calls"]]
    lines += [f"  {choice + ':':<9} {command}" for choice, command in commands]
    return "\n".join(lines)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def example(schema: Any, name: str = "value", depth: int = 0) -> Any:
    """A value shaped like ``schema``, for a human to edit before running the command.

    A schema's examples, enum, const or default give the value when it has one; otherwise
    objects get every property, arrays one item, strings the placeholder ``"<name>"``.
    """
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return f"<{name}>"
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {str(k): example(v, str(k), depth + 1) for k, v in properties.items()}
    if kind == "array":
        return [example(schema.get("items"), name, depth + 1)]
    return {"integer": 0, "number": 0, "boolean": False, "null": None}.get(str(kind), f"<{name}>")


def _client_calls(proposal: Any) -> bool:
    """True when every call a tool request proposes is a client tool's (``client: true``)."""
    calls = proposal.get("calls") if isinstance(proposal, dict) else None
    if not isinstance(calls, list) or not calls:
        return False
    return all(isinstance(c, dict) and c.get("client") for c in calls)


def _proposed_arguments(proposal: Any) -> Any:
    """The arguments a human would edit: a proposal's ``args``, or its one call's."""
    if not isinstance(proposal, dict):
        return None
    if "args" in proposal:
        return proposal["args"]
    calls = proposal.get("calls")
    if isinstance(calls, list) and len(calls) == 1 and isinstance(calls[0], dict):
        return calls[0].get("args")
    if isinstance(calls, list) and calls:
        return {str(c.get("id")): c.get("args") for c in calls if isinstance(c, dict)}
    return None
