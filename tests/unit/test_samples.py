"""The samples in config/samples: each is a valid object for the models and for the CRD schema.

The CRD check uses jsonschema's Draft 4 validator, whose keywords match OpenAPI 3.0's (boolean
exclusiveMinimum), on the structural schema with ``additionalProperties: false`` added to every
typed object: that is what the API server does under kubectl's default strict field validation.
CEL rules are not evaluated here; the models' validators implement the same rules.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from agentflows.api import agent, crd, flow, flowrun

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"
MODELS: dict[str, type[pydantic.BaseModel]] = {
    "Agent": agent.Agent,
    "Flow": flow.Flow,
    "FlowRun": flowrun.FlowRun,
}
SAMPLE_FILES = {
    "Agent": "agentflows_v1alpha1_agent.yaml",
    "Flow": "agentflows_v1alpha1_flow.yaml",
    "FlowRun": "agentflows_v1alpha1_flowrun.yaml",
}


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text(encoding="utf-8"))
    return document


def strict(node: dict[str, Any]) -> dict[str, Any]:
    """Return the schema as plain JSON Schema: x-kubernetes-* dropped, unknown fields refused."""
    out = {k: copy.deepcopy(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("items"), dict):
        out["items"] = strict(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"])
    return out


def crd_validator(kind: str) -> jsonschema.Draft4Validator:
    [definition] = [c for c in crd.build_crds() if c["spec"]["names"]["kind"] == kind]
    schema = strict(definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def crd_errors(kind: str, document: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in crd_validator(kind).iter_errors(document)
    ]


def test_there_is_one_sample_per_kind():
    kinds = sorted(load(p.name)["kind"] for p in SAMPLES.glob("agentflows_*.yaml"))
    assert kinds == sorted(MODELS)


@pytest.mark.parametrize(("kind", "name"), SAMPLE_FILES.items())
def test_sample_is_accepted_by_the_model(kind: str, name: str):
    document = load(name)
    assert document["kind"] == kind
    MODELS[kind].model_validate(document)


@pytest.mark.parametrize(("kind", "name"), SAMPLE_FILES.items())
def test_sample_is_accepted_by_the_crd_schema(kind: str, name: str):
    assert crd_errors(kind, load(name)) == []


def test_kustomization_lists_every_named_sample():
    listed = set(load("kustomization.yaml")["resources"])
    named = {n for n in SAMPLE_FILES.values() if "name" in load(n)["metadata"]}
    assert listed == named


# The checks above would catch a broken sample: the same checks reject broken variants.


def test_crd_schema_rejects_a_misspelled_field():
    document = load(SAMPLE_FILES["Agent"])
    document["spec"]["systemPromt"] = document["spec"].pop("systemPrompt")
    assert crd_errors("Agent", document) == [
        "spec: Additional properties are not allowed ('systemPromt' was unexpected)"
    ]


def test_crd_schema_rejects_an_out_of_range_value_and_a_missing_required_field():
    document = load(SAMPLE_FILES["Flow"])
    document["spec"]["nodes"][1]["map"]["concurrency"] = 0
    del document["spec"]["nodes"][0]["id"]
    errors = crd_errors("Flow", document)
    assert "spec.nodes.1.map.concurrency: 0 is less than the minimum of 1" in errors
    assert "spec.nodes.0: 'id' is a required property" in errors


def test_crd_schema_accepts_any_json_in_free_form_fields():
    document = load(SAMPLE_FILES["FlowRun"])
    document["spec"]["input"] = {"topic": ["nested", {"any": 1}], "n": None}
    assert crd_errors("FlowRun", document) == []


def test_branch_uses_value_so_kubectl_yaml_keeps_the_key():
    text = (SAMPLES / SAMPLE_FILES["Flow"]).read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    branches = [n["branch"] for n in document["spec"]["nodes"] if "branch" in n]
    assert branches and all(isinstance(b["value"], str) for b in branches)
