"""The commands the CLI prints when a local run waits: one complete command per choice.

Each command is shell-quoted (:func:`shlex.join`) so pasting it runs exactly that decision —
never ``--decision approve|reject``, which a shell reads as a pipe into ``reject`` after
approving. The choices of a request are the decisions its kind takes
(``flowrun.DECISIONS``): approve and reject, ``--data`` for an input request (with an example
made from its schema, to edit before running), ``--edits`` when a proposal can be edited.
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


def commands(
    run: str, request_id: str, request: dict[str, Any], state_dir: str | None
) -> list[tuple[str, str]]:
    """``(choice, command)`` for each way to decide a pending request of a local run."""
    base = ["agentflows", "resume", run, "--request", request_id]
    if state_dir is not None:
        base += ["--state-dir", state_dir]
    kind = str(request.get("kind", ""))
    allowed = flowrun_api.DECISIONS.get(kind, frozenset(Decision))
    choices = []
    for decision in _ORDER:
        if decision not in allowed:
            continue
        if decision == Decision.RESPOND:
            if kind != flowrun_api.RequestKind.INPUT:
                continue
            data = json.dumps(example(request.get("schema")), ensure_ascii=False)
            choices.append(("respond", shlex.join([*base, "--data", data])))
        elif decision == Decision.EDIT:
            edits = _proposed_arguments(request.get("proposal"))
            if edits is not None:
                text = json.dumps(edits, ensure_ascii=False)
                choices.append(("edit", shlex.join([*base, "--decision", "edit", "--edits", text])))
        else:
            choices.append((decision.value, shlex.join([*base, "--decision", decision.value])))
    return choices


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
