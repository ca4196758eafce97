"""The one walk of what an Agent or Flow names, and the admission policy made from it (item 22).

Naming a Secret, ConfigMap or claim in any field requires being allowed to read it; the policy
and the operator's view of what a run receives both come from ``agentflows.api.references``.
These tests keep the walk complete (every field of those types in the models is a pattern), the
policy file generated from it, and the runner pod's Secret env equal to what the walk finds.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentflows.api import agent as agent_api
from agentflows.api import common, reference_policy, references
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import runner as runner_api
from agentflows.controller import pods
from tests.cluster import test_secret_reference_policy as cluster_cases

REPO = Path(__file__).resolve().parents[2]
#: The model types that name an object of the namespace, by the kind they name.
NAMING: dict[type, str] = {
    common.SecretKeySelector: references.SECRET,
    agent_api.ConfigMapKeySelector: references.CONFIG_MAP,
    runner_api.ConfigMapFiles: references.CONFIG_MAP,
    runner_api.ClaimFiles: references.CLAIM,
}


def _models_in(annotation: Any) -> list[tuple[Any, str]]:
    """The types inside an annotation, with "[]"/"{}" for the list or map levels around them."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return [(annotation, "")] if isinstance(annotation, type) else []
    args = typing.get_args(annotation)
    if origin is list:
        return [(m, "[]" + s) for a in args for m, s in _models_in(a)]
    if origin is dict:
        return [(m, "{}" + s) for m, s in _models_in(args[1])]
    return [found for a in args for found in _models_in(a)]


def _naming_fields(model: type[BaseModel]) -> set[tuple[str, str]]:
    """(kind, path) of every field under ``model`` whose type names an object."""
    found: set[tuple[str, str]] = set()

    def walk(current: Any, path: str, seen: frozenset[type]) -> None:
        if current in NAMING:
            found.add((NAMING[current], path))
            return
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or current in seen:
            return
        for name, field in current.model_fields.items():
            alias = field.alias or name
            for inner, suffix in _models_in(field.annotation):
                walk(inner, f"{path}.{alias}{suffix}".lstrip("."), seen | {current})

    walk(model, "", frozenset())
    return found


def test_every_field_that_names_a_secret_configmap_or_claim_is_in_the_walk() -> None:
    for kind, spec in (("Agent", agent_api.AgentSpec), ("Flow", flow_api.FlowSpec)):
        walked = {(p.kind, p.path) for p in references.PATTERNS[kind]}
        assert _naming_fields(spec) == walked, kind
    assert _naming_fields(flowrun_api.FlowRunSpec) == set()  # a FlowRun names nothing


def test_the_admission_policy_is_the_one_generated_from_the_walk() -> None:
    shipped = (REPO / reference_policy.PATH).read_text()
    assert shipped == reference_policy.render(), (
        "run: python -m agentflows.api.reference_policy --write"
    )


def test_the_cluster_test_tries_every_place_a_name_can_sit() -> None:
    tried = {
        (manifest["kind"], found.pattern)
        for _, manifest in cluster_cases.REFERENCES.values()
        for found in references.references(manifest["kind"], manifest["spec"])
    }
    every = {(kind, p.path) for kind, patterns in references.PATTERNS.items() for p in patterns}
    assert tried == every


def test_files_and_inline_mcp_headers_are_found_with_their_paths() -> None:
    spec = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {
                    "id": "ask",
                    "agent": {
                        "name": "helper",
                        "prompt": "hi",
                        "files": [
                            {"configMapKeyRef": {"name": "handbook", "key": "a.md"}},
                            {"secretKeyRef": {"name": "notes", "key": "b.md"}},
                        ],
                    },
                },
                {
                    "id": "call",
                    "tool": {
                        "name": "search",
                        "mcp": {
                            "url": "http://127.0.0.1:9/mcp",
                            "headers": {"X-Token": {"secretKeyRef": {"name": "mcp", "key": "t"}}},
                        },
                    },
                },
            ]
        }
    )
    found = {(r.path, r.kind, r.name) for r in references.flow_references(spec)}
    assert found == {
        ("spec.nodes[0].agent.files[0].configMapKeyRef", "ConfigMap", "handbook"),
        ("spec.nodes[0].agent.files[1].secretKeyRef", "Secret", "notes"),
        ("spec.nodes[1].tool.mcp.headers.X-Token.secretKeyRef", "Secret", "mcp"),
    }


def test_a_flow_inline_mcp_header_secret_reaches_the_runner_pods_secrets_volume() -> None:
    spec = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {
                    "id": "call",
                    "tool": {
                        "name": "search",
                        "mcp": {
                            "url": "http://127.0.0.1:9/mcp",
                            "headers": {"X-Token": {"secretKeyRef": {"name": "mcp", "key": "t"}}},
                        },
                    },
                }
            ]
        }
    )
    assert pods.secret_refs({"f": spec}, {}) == {"mcp": {"t"}}
