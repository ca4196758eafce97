"""Every Secret, ConfigMap and PersistentVolumeClaim an Agent or Flow names: the one walk.

The runner pod receives what the run's Agents and Flows name — Secrets as env, ConfigMap keys
read for reference files, volumes mounted — so naming an object must require being allowed to
read it. The places a name can sit are declared once, here, as :data:`AGENT` and :data:`FLOW`
patterns over the wire JSON of a spec (``[]``: every item of a list, ``{}``: every value of a
map). From them come

- :func:`references`, the Python walk: the operator's Ready checks and the pod's Secret env
  (:mod:`agentflows.controller.resolve`, :mod:`agentflows.controller.pods`);
- :func:`cel_names`, the same walk in CEL: the ValidatingAdmissionPolicy
  ``config/policies/secret-references.yaml`` (:mod:`agentflows.api.reference_policy` writes it),
  where the API server asks its authorizer whether the requesting user may ``get`` each object.

A FlowRun names none: it runs a Flow, whose references were checked as its author wrote them.
``tests/unit/test_reference_walk.py`` walks the models' types and fails when a field of a
Secret, ConfigMap or claim type is not covered by a pattern, so a new field cannot be missed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api

SECRET = "Secret"
CONFIG_MAP = "ConfigMap"
CLAIM = "PersistentVolumeClaim"
#: The authorizer's resource of each kind.
RESOURCES = {SECRET: "secrets", CONFIG_MAP: "configmaps", CLAIM: "persistentvolumeclaims"}


@dataclasses.dataclass(frozen=True)
class Pattern:
    """Where an object's name sits in a spec: ``path`` (from ``spec``) to the selector."""

    kind: str
    path: str
    name_field: str = "name"
    #: Read by the runner (False: the webhook receiver's trigger secrets).
    for_runner: bool = True


@dataclasses.dataclass(frozen=True)
class Reference:
    """One name found: the field's path (``spec.tools[0].mcp.headers.X.secretKeyRef``)."""

    path: str
    kind: str
    name: str
    key: str | None
    for_runner: bool
    #: The :attr:`Pattern.path` that found it.
    pattern: str


def _files(prefix: str) -> tuple[Pattern, ...]:
    return (
        Pattern(SECRET, f"{prefix}files[].secretKeyRef"),
        Pattern(CONFIG_MAP, f"{prefix}files[].configMapKeyRef"),
    )


def _tool(prefix: str) -> tuple[Pattern, ...]:
    return (
        Pattern(SECRET, f"{prefix}http.secretHeaders{{}}.secretKeyRef"),
        Pattern(SECRET, f"{prefix}mcp.headers{{}}.secretKeyRef"),
    )


AGENT: tuple[Pattern, ...] = (
    Pattern(SECRET, "model.apiKey.secretKeyRef"),
    *_tool("tools[]."),
    *_files(""),
)
FLOW: tuple[Pattern, ...] = (
    Pattern(SECRET, "nodes[].llm.model.apiKey.secretKeyRef"),
    *_tool("nodes[].tool."),
    *_tool("nodes[].map.tool."),
    *_files("nodes[].agent."),
    *_files("nodes[].map.agent."),
    Pattern(SECRET, "runner.env[].secretKeyRef"),
    Pattern(CONFIG_MAP, "runner.files[].configMap"),
    Pattern(CLAIM, "runner.files[].persistentVolumeClaim", name_field="claimName"),
    Pattern(SECRET, "triggers[].webhook.secret", for_runner=False),
)
PATTERNS = {"Agent": AGENT, "Flow": FLOW}


def _segments(path: str) -> list[tuple[str, str]]:
    """``a[].b{}.c`` -> ``[("a", "[]"), ("b", "{}"), ("c", "")]``."""
    out = []
    for part in path.split("."):
        if part.endswith(("[]", "{}")):
            out.append((part[:-2], part[-2:]))
        else:
            out.append((part, ""))
    return out


def _walk(value: Any, segments: list[tuple[str, str]], path: str) -> Iterator[tuple[str, Any]]:
    if not segments:
        yield path, value
        return
    (field, each), rest = segments[0], segments[1:]
    if not isinstance(value, Mapping) or value.get(field) is None:
        return
    found = value[field]
    if each == "[]" and isinstance(found, list):
        for index, item in enumerate(found):
            yield from _walk(item, rest, f"{path}.{field}[{index}]")
    elif each == "{}" and isinstance(found, Mapping):
        for key, item in found.items():
            yield from _walk(item, rest, f"{path}.{field}.{key}")
    elif not each:
        yield from _walk(found, rest, f"{path}.{field}")


def references(kind: str, spec: Mapping[str, Any]) -> list[Reference]:
    """Every object the spec (wire JSON) of an Agent or Flow names, in pattern order."""
    found: list[Reference] = []
    for pattern in PATTERNS[kind]:
        for path, selector in _walk(spec, _segments(pattern.path), "spec"):
            if isinstance(selector, Mapping) and selector.get(pattern.name_field):
                key = selector.get("key")
                found.append(
                    Reference(
                        path=path,
                        kind=pattern.kind,
                        name=str(selector[pattern.name_field]),
                        key=str(key) if key is not None else None,
                        for_runner=pattern.for_runner,
                        pattern=pattern.path,
                    )
                )
    return found


def agent_references(spec: agent_api.AgentSpec) -> list[Reference]:
    """Every object an Agent names."""
    return references("Agent", spec.to_wire())


def flow_references(spec: flow_api.FlowSpec) -> list[Reference]:
    """Every object a Flow names itself (not its Agents')."""
    return references("Flow", spec.to_wire())


def cel_names(pattern: Pattern, root: str = "object.spec") -> str:
    """A CEL expression: the names ``pattern`` finds under ``root``, as a list of strings.

    A list or map level is mapped and joined with "," (never part of a name); the policy joins
    and splits the whole once more, so nesting flattens to one list.
    """
    return _cel(root, [*_segments(pattern.path), (pattern.name_field, "")], 0)


def _cel(expr: str, segments: list[tuple[str, str]], depth: int) -> str:
    (field, each), rest = segments[0], segments[1:]
    here = f"{expr}.{field}"
    if not each:
        inner = f"[{here}]" if not rest else _cel(here, rest, depth)
        return f"(has({here}) ? {inner} : [])"
    var = f"x{depth}"
    item = var if each == "[]" else f"{here}[{var}]"
    inner = f"[{item}]" if not rest else _cel(item, rest, depth + 1)
    return f"(has({here}) ? {here}.map({var}, {inner}.join(',')) : [])"
