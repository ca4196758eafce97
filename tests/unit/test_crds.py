"""The generated CRDs: in sync with the models, structural, described, and with the right names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from agentflows import api
from agentflows.api import agent, agentsession, common, crd, flow, flowrun

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m agentflows.api.crd --write"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
#: JSON Schema keywords the pydantic schema has and a structural CRD schema must not.
FORBIDDEN_KEYWORDS = {
    "$ref",
    "$defs",
    "anyOf",
    "allOf",
    "oneOf",
    "not",
    "title",
    "default",
    "const",
}


def crds_by_kind() -> dict[str, dict[str, Any]]:
    return {c["spec"]["names"]["kind"]: c for c in crd.build_crds()}


def schema_of(kind: str) -> dict[str, Any]:
    version = crds_by_kind()[kind]["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (path, schema) for a schema node and every node under it."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def all_nodes() -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in crds_by_kind():
        yield from walk(schema_of(kind), kind)


def free_form_field_names() -> set[str]:
    """Wire names of every model field marked common.FREE_FORM."""
    names = set()
    for module in (common, agent, agentsession, flow, flowrun):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel):
                for name, field in value.model_fields.items():
                    extra = field.json_schema_extra
                    if isinstance(extra, dict) and extra.get(PRESERVE):
                        names.add(field.alias or name)
    return names


# --- drift -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("directory", "kustomization"), [(crd.CRDS_DIR, False), (crd.KUSTOMIZE_DIR, True)]
)
def test_checked_in_crds_match_what_the_models_generate(directory: Path, kustomization: bool):
    expected = crd.rendered_files(kustomization=kustomization)
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / directory).glob("*.yaml")}
    stale = sorted(n for n in expected.keys() | on_disk.keys() if expected.get(n) != on_disk.get(n))
    assert not stale, (
        f"{directory}/ is out of date with the models in operator/agentflows/api "
        f"({', '.join(stale)}); regenerate with `{REGENERATE}` from the repository root"
    )


def test_rendering_is_deterministic():
    assert crd.render_yaml(crd.build_crds()) == crd.render_yaml(crd.build_crds())


def test_write_puts_one_file_per_kind_and_a_kustomization_listing_them(tmp_path: Path):
    written = crd.write(tmp_path, kustomization=True)
    names = sorted(p.name for p in written)
    assert names == [
        "agentflows.io_agents.yaml",
        "agentflows.io_agentsessions.yaml",
        "agentflows.io_budgets.yaml",
        "agentflows.io_flowruns.yaml",
        "agentflows.io_flows.yaml",
        "kustomization.yaml",
    ]
    assert "agentflows.io_flowruns.yaml" in (tmp_path / "kustomization.yaml").read_text()


def test_write_command_regenerates_both_directories(tmp_path: Path):
    assert crd.main(["--write", "--root", str(tmp_path)]) == 0
    for directory, kustomization in ((crd.CRDS_DIR, False), (crd.KUSTOMIZE_DIR, True)):
        on_disk = {p.name: p.read_text() for p in (tmp_path / directory).iterdir()}
        assert on_disk == crd.rendered_files(kustomization=kustomization)


def test_crds_directory_holds_only_crds_so_helm_can_install_it():
    assert not (ROOT / crd.CRDS_DIR / "kustomization.yaml").exists()


# --- names and versions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "plural", "short_name"),
    [("Agent", "agents", "ag"), ("Flow", "flows", "fl"), ("FlowRun", "flowruns", "fr")],
)
def test_each_kind_is_namespaced_with_its_names_and_status_subresource(
    kind: str, plural: str, short_name: str
):
    spec = crds_by_kind()[kind]["spec"]
    assert crds_by_kind()[kind]["metadata"]["name"] == f"{plural}.agentflows.io"
    assert spec["group"] == api.GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short_name]
    assert spec["names"]["categories"] == ["agentflows"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


READY = '.status.conditions[?(@.type=="Ready")].status'


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        ("Agent", {"Model": ".spec.model.name", "Ready": READY}),
        ("Flow", {"Ready": READY, "Last Run": ".status.lastRun", "Active": ".status.activeRuns"}),
        (
            "FlowRun",
            {
                "Flow": ".spec.flow",
                "Phase": ".status.phase",
                "Node": ".status.currentNode",
                "Attempt": ".status.attempt",
                "Duration": ".status.duration",
                "Trigger": ".spec.trigger.type",
                "Reason": ".status.reason",
                "Message": ".status.message",
            },
        ),
    ],
)
def test_kubectl_get_shows_the_printer_columns(kind: str, columns: dict[str, str]):
    printed = crds_by_kind()[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in printed] == [*columns, "Age"]
    assert {c["name"]: c["jsonPath"] for c in printed[:-1]} == columns
    assert printed[-1]["jsonPath"] == ".metadata.creationTimestamp"
    schema = schema_of(kind)
    for column in printed[:-1]:
        # A column path must exist in the schema, or kubectl prints an empty column forever.
        node = schema
        for part in column["jsonPath"].split("[")[0].strip(".").split("."):
            node = node["properties"][part]


def test_printer_column_types_match_the_schema():
    for kind, c in crds_by_kind().items():
        for column in c["spec"]["versions"][0]["additionalPrinterColumns"]:
            if column["type"] == "integer":
                *parents, leaf = column["jsonPath"].strip(".").split(".")
                node = schema_of(kind)
                for part in parents:
                    node = node["properties"][part]
                assert node["properties"][leaf]["type"] == "integer", (kind, column["name"])


# --- structural schema -------------------------------------------------------------------------


def test_schemas_use_none_of_the_keywords_a_structural_schema_forbids():
    offending = [
        (path, sorted(FORBIDDEN_KEYWORDS & node.keys()))
        for path, node in all_nodes()
        if FORBIDDEN_KEYWORDS & node.keys() or node.get("additionalProperties") is False
    ]
    assert not offending


def test_every_node_has_a_type_unless_it_is_free_form():
    untyped = [path for path, node in all_nodes() if "type" not in node and not node.get(PRESERVE)]
    assert not untyped


def test_every_field_has_a_description_for_kubectl_explain():
    undescribed = [
        f"{path}.{name}"
        for path, node in all_nodes()
        for name, sub in node.get("properties", {}).items()
        # The API server forbids even a description on the root's metadata.
        if not sub.get("description") and not (name == "metadata" and "." not in path)
    ]
    assert not undescribed


@pytest.mark.parametrize("kind", ["Agent", "Flow", "FlowRun", "AgentSession"])
def test_metadata_is_left_to_the_api_server(kind: str):
    properties = schema_of(kind)["properties"]
    assert properties["metadata"] == {"type": "object"}
    assert properties["apiVersion"]["type"] == properties["kind"]["type"] == "string"


def test_preserve_unknown_fields_marks_only_free_form_leaves():
    free_form = free_form_field_names()
    marked = [(path, node) for path, node in all_nodes() if PRESERVE in node]
    assert marked
    for path, node in marked:
        assert set(node) == {"description", PRESERVE}, path
        assert path.rsplit(".", 1)[-1] in free_form, f"{path} is not a free-form field"


def test_every_free_form_field_keeps_unknown_fields():
    marked_names = {path.rsplit(".", 1)[-1] for path, node in all_nodes() if node.get(PRESERVE)}
    assert free_form_field_names() <= marked_names


def test_numbers_use_openapi_v3_0_bounds_and_formats():
    for path, node in all_nodes():
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node:
                assert node[key] is True, path
                assert ("minimum" if key == "exclusiveMinimum" else "maximum") in node, path
        if node.get("type") == "integer":
            assert node["format"] == "int64", path


def test_every_bound_is_a_number_the_api_server_reads_exactly():
    # The API server reads minimum/maximum as float64: 2**63 - 1 became 2**63, overflowed to
    # the int64 minimum, and every FlowRun status with usage was refused (maximum -2**63).
    for path, node in all_nodes():
        for key in ("minimum", "maximum"):
            if key in node:
                assert abs(node[key]) <= 2**53 - 1, f"{path}.{key} = {node[key]}"
                assert float(node[key]) == node[key], f"{path}.{key} = {node[key]}"


def test_optional_fields_are_not_required_and_required_ones_are():
    assert schema_of("Agent")["properties"]["spec"]["required"] == ["model"]
    assert schema_of("Flow")["properties"]["spec"]["required"] == ["nodes"]
    assert schema_of("FlowRun")["properties"]["spec"]["required"] == ["flow"]
    assert schema_of("FlowRun")["required"] == ["spec"]


@pytest.mark.parametrize("kind", ["Agent", "Flow", "FlowRun"])
def test_conditions_are_a_list_map_keyed_by_type(kind: str):
    conditions = schema_of(kind)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_enums_and_literals_become_string_enums():
    spec = schema_of("Flow")["properties"]["spec"]["properties"]
    assert spec["autonomy"] == {
        "description": "readonly, supervised or full.",
        "enum": ["readonly", "supervised", "full"],
        "type": "string",
    }
    phase = schema_of("FlowRun")["properties"]["status"]["properties"]["phase"]
    assert "Waiting" in phase["enum"]


def test_typed_maps_keep_their_value_schema():
    status = schema_of("FlowRun")["properties"]["status"]["properties"]
    assert status["requests"]["type"] == "object"
    assert status["requests"]["additionalProperties"]["properties"]["decision"]["enum"]


# --- CEL rules ---------------------------------------------------------------------------------


def rules_at(node: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


def test_cross_field_rules_sit_on_the_object_they_constrain():
    flow_spec = schema_of("Flow")["properties"]["spec"]
    assert any("m.id == n.id" in r for r in rules_at(flow_spec))
    assert any(
        "has(self.approval)" in r for r in rules_at(flow_spec["properties"]["nodes"]["items"])
    )
    agent_spec = schema_of("Agent")["properties"]["spec"]
    tool = agent_spec["properties"]["tools"]["items"]
    assert any("has(self.mcp)" in r for r in rules_at(tool))
    assert rules_at(tool["properties"]["mcp"]) == [
        "has(self.url) != has(self.command)",
        "!has(self.sse) || !self.sse || has(self.url)",
        "!has(self.env) || self.env.all(k, !k.startsWith('AGENTFLOWS_'))",
    ]


def test_every_model_rule_reaches_the_crd():
    for kind, model in (("Agent", agent.Agent), ("Flow", flow.Flow), ("FlowRun", flowrun.FlowRun)):
        in_models = {
            rule["rule"]
            for definition in model.model_json_schema(by_alias=True).get("$defs", {}).values()
            for rule in definition.get("x-kubernetes-validations", [])
        }
        in_crd = {rule for _, node in walk(schema_of(kind), kind) for rule in rules_at(node)}
        assert in_crd == in_models, kind


# --- the generator refuses what it cannot express ----------------------------------------------


class _Union(common.ApiModel):
    """A model with a union a structural schema cannot express."""

    value: int | str = Field(description="An int or a string.")


class _Undescribed(common.ApiModel):
    """A model with a field lacking a description."""

    value: int


def resource_for(model: type[BaseModel]) -> crd.Resource:
    return crd.Resource(
        model=model, kind="Test", plural="tests", short_name="t", printer_columns=()
    )


def test_a_union_field_is_refused_with_its_path():
    with pytest.raises(crd.UnsupportedSchema, match=r"Test\.value: unions"):
        crd.openapi_schema(resource_for(_Union))


def test_a_field_without_description_is_refused_with_its_path():
    with pytest.raises(
        crd.UnsupportedSchema, match=r"Test\.value: every field needs a description"
    ):
        crd.openapi_schema(resource_for(_Undescribed))
