"""Read back the jq shapes :mod:`.importer` writes, for :mod:`.exporter`.

Each function recognises one shape exactly as the importer (and :mod:`.mapping`) writes it and
returns its parts, or None for anything else, so a hand-written expression that merely looks
similar is refused by the exporter with its path rather than exported wrongly.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentflows.agentspec import checks, mapping
from agentflows.api import flow as flow_api

_JOIN = re.compile(
    r"^=\(\.nodes\.[a-z][a-z0-9_]*\.json\)(?: \+ \(\.nodes\.[a-z][a-z0-9_]*\.json\))*$"
)
_CATCH = re.compile(
    r'^=\.nodes\.([a-z][a-z0-9_]*)\.json \| if type == "object" and has\("caughtError"\) then '
    r"(\{.*\}) \+ \{"
    + re.escape(
        f'"{checks.CAUGHT_INFO}": .caughtError, "{mapping.BRANCH_OUTPUT}": "{checks.CAUGHT_BRANCH}"'
    )
    + r"\} else \{"
    + re.escape(f'"{mapping.BRANCH_OUTPUT}": ')
    + r'("[^"]*")\} \+ \. \+ \{'
    + re.escape(f'"{checks.CAUGHT_INFO}": null')
    + r"\} end$"
)


def parallels(spec: flow_api.FlowSpec) -> dict[str, list[str]]:
    """Join id -> flow node ids of each ParallelFlowNode (fork ``={}`` -> flow nodes -> join)."""
    nodes = {n.id: n for n in spec.nodes}
    after: dict[str, list[str]] = {n: [] for n in nodes}
    before: dict[str, list[str]] = {n: [] for n in nodes}
    for edge in spec.edges:
        after.setdefault(edge.from_, []).append(edge.to)
        before.setdefault(edge.to, []).append(edge.from_)
    found: dict[str, list[str]] = {}
    for join in spec.nodes:
        if join.transform is None or not _JOIN.match(join.transform):
            continue
        calls = re.findall(r"\.nodes\.([a-z][a-z0-9_]*)\.json", join.transform)
        forks = {tuple(before.get(c, [])) for c in calls}
        only = next(iter(forks)) if len(forks) == 1 else ()
        fork = nodes.get(only[0]) if len(only) == 1 else None
        if (
            fork is None
            or fork.transform != "={}"
            or sorted(after[fork.id]) != sorted(calls)
            or any(c not in nodes or nodes[c].flow is None for c in calls)
            or any(after[c] != [join.id] for c in calls)
        ):
            continue
        found[join.id] = calls
    return found


def fork_of(spec: flow_api.FlowSpec, calls: list[str]) -> str:
    """The fork node before the flow nodes of a ParallelFlowNode."""
    return next(e.from_ for e in spec.edges if e.to == calls[0])


def catch(node: flow_api.Node) -> tuple[str, dict[str, Any]] | None:
    """The ``catchErrors`` flow node and the outputs' defaults of a CatchExceptionNode."""
    match = _CATCH.match(node.transform or "")
    if match is None:
        return None
    try:
        defaults = json.loads(match.group(2))
    except ValueError:
        return None
    return (match.group(1), defaults) if isinstance(defaults, dict) else None


def split_alternatives(expr: str) -> list[str]:
    """``(a) // (b)`` -> ``[a, b]``; a single expression -> ``[expr]``."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(expr):
        char = expr[i]
        if char == '"':
            i = expr.index('"', i + 1)
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and expr.startswith(" // ", i):
            parts.append(expr[start:i])
            start = i + 4
        i += 1
    parts.append(expr[start:])
    if len(parts) == 1:
        return parts
    return [p[1:-1] if p.startswith("(") and p.endswith(")") else p for p in parts]


def parse_object(text: str) -> dict[str, str] | None:
    """``{"k": (expr), ...}`` -> ``{k: expr}``; None for another shape."""
    if not (text.startswith("{") and text.endswith("}")):
        return None
    body, out, i = text[1:-1], {}, 0
    while i < len(body):
        match = re.match(r'"([^"]+)": \(', body[i:])
        if match is None:
            return None
        i += match.end()
        depth, start = 1, i
        while depth and i < len(body):
            if body[i] == '"':
                i = body.index('"', i + 1)
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        out[match.group(1)] = body[start : i - 1]
        if body.startswith(", ", i):
            i += 2
    return out


def literal_string(expr: str | None) -> str | None:
    """The string a jq literal ``"x"`` stands for; None for anything else."""
    if expr is None:
        return None
    try:
        value = json.loads(expr)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


_AS_TEXT_SUFFIX = f") | {mapping.AS_TEXT})"


def parse_text(text: str) -> list[tuple[bool, str]] | None:
    """Read back :func:`mapping.jq_text`: (is an expression, literal or expression) parts."""
    parts: list[tuple[bool, str]] = []
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        if text.startswith('"', i):
            try:
                literal, i = decoder.raw_decode(text, i)
            except ValueError:
                return None
            parts.append((False, literal))
        elif text.startswith("((", i):
            end = closing_paren(text, i + 1)
            if end < 0 or not text.startswith(_AS_TEXT_SUFFIX, end):
                return None
            parts.append((True, text[i + 2 : end]))
            i = end + len(_AS_TEXT_SUFFIX)
        else:
            return None
        if text.startswith(" + ", i):
            i += 3
        elif i < len(text):
            return None
    return parts or None


def closing_paren(text: str, start: int) -> int:
    """The index of the parenthesis closing the one at ``start`` (-1 if none)."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == '"':
            i = text.find('"', i + 1)
            if i < 0:
                return -1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def split_commas(text: str) -> list[str]:
    """Split ``(a), (b)`` at top-level commas."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def a2a(node: flow_api.Node, nodes: dict[str, flow_api.Node]) -> str | None:
    """The ``message/send`` tool node of an AgentNode with an A2AAgent (its transform's input)."""
    prefix = "=.nodes."
    suffix = f".json | {mapping.A2A_TEXT}"
    text = node.transform or ""
    if not (text.startswith(prefix) and text.endswith(suffix)):
        return None
    call = nodes.get(text[len(prefix) : -len(suffix)])
    http = call.tool.http if call is not None and call.tool is not None else None
    args = call.tool.args if call is not None and call.tool is not None else None
    if call is None or http is None or http.method != "POST" or not isinstance(args, dict):
        return None
    titles = [t for t in args if t != "message_id"]
    return call.id if http.body == mapping.a2a_body(titles) else None
