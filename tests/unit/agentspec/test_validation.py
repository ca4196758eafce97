"""Every graph rule and document rule refuses a failing document with its path (exit 2)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentflows.agentspec import document
from tests.unit.agentspec.conftest import DATA, invoke

MODEL = {
    "component_type": "OpenAiCompatibleConfig", "name": "m", "model_id": "m",
    "url": "http://127.0.0.1:8000/v1",
}  # fmt: skip


def ref(cid: str) -> dict[str, str]:
    return {"$component_ref": cid}


def edge(source: str, target: str, branch: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "component_type": "ControlFlowEdge", "name": f"{source}-{target}",
        "from_node": ref(source), "to_node": ref(target),
    }  # fmt: skip
    if branch is not None:
        out["from_branch"] = branch
    return out


def data(source: str, output: str, target: str, name: str) -> dict[str, Any]:
    return {
        "component_type": "DataFlowEdge", "name": f"{source}-{output}-{target}",
        "source_node": ref(source), "source_output": output,
        "destination_node": ref(target), "destination_input": name,
    }  # fmt: skip


def base() -> dict[str, Any]:
    """start -> ask (LlmNode) -> end, valid."""
    return {
        "agentspec_version": "26.2.0",
        "component_type": "Flow",
        "name": "base",
        "start_node": ref("start"),
        "nodes": [ref("start"), ref("ask"), ref("end")],
        "control_flow_connections": [edge("start", "ask"), edge("ask", "end")],
        "data_flow_connections": [
            data("start", "q", "ask", "q"),
            data("ask", "generated_text", "end", "answer"),
        ],
        "$referenced_components": {
            "start": {"component_type": "StartNode", "name": "start", "outputs": [{"title": "q", "type": "string"}]},
            "ask": {"component_type": "LlmNode", "name": "ask", "llm_config": MODEL, "prompt_template": "{{q}}"},
            "end": {"component_type": "EndNode", "name": "end", "outputs": [{"title": "answer", "type": "string"}]},
            "branch": {"component_type": "BranchingNode", "name": "branch", "mapping": {"yes": "YES"}},
            "other": {"component_type": "EndNode", "name": "other"},
        },
    }  # fmt: skip


def problems(doc: dict[str, Any], tmp_path: Path) -> str:
    """What ``agentflows validate`` prints for a document it must refuse."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    code, out, err = invoke("validate", str(path))
    assert code == 2, out + err
    return out


def test_the_base_document_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(base()))
    code, out, err = invoke("validate", str(path))
    assert code == 0, out + err
    assert out.strip() == "1 resource(s) valid"


def test_a_node_no_edge_reaches_is_unreachable(tmp_path: Path) -> None:
    doc = base()
    doc["nodes"].append(ref("other"))
    out = problems(doc, tmp_path)
    assert "nodes[3]: EndNode 'other' is not reachable from the start node" in out


def test_several_unconditional_edges_do_not_fan_out_the_second_target_never_runs(
    tmp_path: Path,
) -> None:
    doc = base()
    doc["nodes"].append(ref("other"))
    doc["control_flow_connections"].append(edge("ask", "other"))
    out = problems(doc, tmp_path)
    assert "nodes[3]: EndNode 'other' is reached only through an edge that is never taken" in out


def test_a_dead_end_and_no_reachable_end_node_are_refused(tmp_path: Path) -> None:
    doc = base()
    doc["control_flow_connections"] = [edge("start", "ask")]
    out = problems(doc, tmp_path)
    assert (
        "nodes[1]: LlmNode 'ask' is a dead end: no control edge leaves it on branch 'next'" in out
    )
    assert "nodes: no EndNode is reachable from the start node" in out


def test_a_branching_mapping_to_a_branch_no_edge_leaves_on_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["nodes"].append(ref("branch"))
    doc["control_flow_connections"] = [
        edge("start", "branch"), edge("branch", "end", "default"), edge("ask", "end"),
    ]  # fmt: skip
    doc["data_flow_connections"] = [data("start", "q", "branch", "branching_mapping_key")]
    out = problems(doc, tmp_path)
    assert (
        "nodes[3].mapping.yes: maps to branch 'YES', but no control edge leaves 'branch' on it"
        in out
    )


def test_an_edge_on_a_branch_its_source_never_selects_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["control_flow_connections"][1] = edge("ask", "end", "YES")
    out = problems(doc, tmp_path)
    assert (
        "control_flow_connections[1].from_branch: ask never selects branch 'YES' "
        "(its branches: next)"
    ) in out


def test_reading_anything_but_generated_text_from_an_unstructured_llm_node_is_refused(
    tmp_path: Path,
) -> None:
    doc = base()
    doc["data_flow_connections"][1] = data("ask", "summary", "end", "answer")
    out = problems(doc, tmp_path)
    assert (
        "data_flow_connections[1].source_output: LlmNode 'ask' has no output 'summary' "
        "(it produces: generated_text)"
    ) in out


def test_a_data_edge_from_a_node_outside_the_flow_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["data_flow_connections"][1] = data("other", "x", "end", "answer")
    out = problems(doc, tmp_path)
    assert "data_flow_connections[1].source_node: node 'other' is not in this flow's nodes" in out


def test_a_loop_through_a_branching_node_is_valid(tmp_path: Path) -> None:
    doc = base()
    doc["nodes"].append(ref("branch"))
    doc["control_flow_connections"] = [
        edge("start", "ask"), edge("ask", "branch"),
        edge("branch", "ask", "YES"), edge("branch", "end", "default"),
    ]  # fmt: skip
    doc["data_flow_connections"].append(
        data("ask", "generated_text", "branch", "branching_mapping_key")
    )
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    code, out, err = invoke("validate", str(path))
    assert (code, out.strip()) == (0, "1 resource(s) valid"), err


def test_an_unresolved_reference_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["nodes"][1] = ref("asks")
    out = problems(doc, tmp_path)
    assert "nodes[1].$component_ref: unresolved reference 'asks'" in out


def test_two_inline_components_with_one_id_are_refused(tmp_path: Path) -> None:
    doc = base()
    doc["$referenced_components"]["ask"]["llm_config"] = {**MODEL, "id": "m1"}
    doc["$referenced_components"]["end"]["metadata"] = {"model": {**MODEL, "id": "m1"}}
    out = problems(doc, tmp_path)
    assert "duplicate id 'm1' (first at $referenced_components.ask.llm_config)" in out


def test_an_inline_copy_of_a_referenced_component_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["nodes"][1] = {**doc["$referenced_components"]["ask"], "id": "ask"}
    out = problems(doc, tmp_path)
    assert "nodes[1].id: 'ask' is a referenced component written out again inline" in out


def test_a_reference_cycle_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["$referenced_components"]["ask"]["metadata"] = {"see": ref("end")}
    doc["$referenced_components"]["end"]["metadata"] = {"see": ref("ask")}
    out = problems(doc, tmp_path)
    assert "reference cycle: ask -> end -> ask" in out


def test_references_that_expand_past_the_component_bound_are_refused(tmp_path: Path) -> None:
    doc = base()
    refs = doc["$referenced_components"]
    refs["l0"] = {"component_type": "EndNode", "name": "l0"}
    for level in range(1, 6):
        refs[f"l{level}"] = {
            "component_type": "EndNode", "name": f"l{level}",
            "metadata": {"many": [ref(f"l{level - 1}")] * 10},
        }  # fmt: skip
    refs["end"]["metadata"] = {"bomb": ref("l5")}
    out = problems(doc, tmp_path)
    assert f"more than {document.MAX_COMPONENTS} components once references are expanded" in out


def test_a_chain_of_references_deeper_than_the_bound_is_refused(tmp_path: Path) -> None:
    doc = base()
    refs = doc["$referenced_components"]
    depth = document.MAX_REFERENCE_DEPTH + 2
    for i in range(depth):
        refs[f"c{i}"] = {
            "component_type": "EndNode",
            "name": f"c{i}",
            "metadata": {"next": ref(f"c{i + 1}")},
        }
    refs[f"c{depth}"] = {"component_type": "EndNode", "name": "last"}
    refs["end"]["metadata"] = {"chain": ref("c0")}
    out = problems(doc, tmp_path)
    assert f"references nest deeper than {document.MAX_REFERENCE_DEPTH}" in out


@pytest.mark.parametrize("title", ["my answer", "a.b", "", "{x}", "x,y", "it's"])
def test_a_property_title_with_a_forbidden_character_is_refused(tmp_path: Path, title: str) -> None:
    doc = base()
    doc["$referenced_components"]["end"]["outputs"] = [{"title": title, "type": "string"}]
    out = problems(doc, tmp_path)
    assert "$referenced_components.end.outputs[0].title: " in out


def test_an_unknown_component_type_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["$referenced_components"]["ask"]["component_type"] = "LLMNode"
    out = problems(doc, tmp_path)
    assert "$referenced_components.ask.component_type: unknown component type 'LLMNode'" in out


@pytest.mark.parametrize("version", ["25.3.0", "26.3.1", "27.0.0"])
def test_an_unsupported_version_is_refused_with_the_versions_read(
    tmp_path: Path, version: str
) -> None:
    doc = base()
    doc["agentspec_version"] = version
    out = problems(doc, tmp_path)
    assert (
        f"agentspec_version: version '{version}' is not supported; agentflows reads 25.4.0" in out
    )


@pytest.mark.parametrize("version", document.SUPPORTED_VERSIONS)
def test_every_supported_version_imports(tmp_path: Path, version: str) -> None:
    text = (
        (DATA / "branching.yaml")
        .read_text()
        .replace("agentspec_version: 26.2.0", f"agentspec_version: {version}")
    )
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    code, out, err = invoke("import", str(path))
    assert code == 0, err
    assert "name: ticket-router" in out


def test_a_misspelled_field_is_reported_at_its_path(tmp_path: Path) -> None:
    doc = copy.deepcopy(base())
    ask = doc["$referenced_components"]["ask"]
    ask["prompt_templat"] = ask.pop("prompt_template")
    out = problems(doc, tmp_path)
    assert "prompt_templat: unknown field" in out


def test_parallel_sub_flows_giving_the_same_output_are_refused(tmp_path: Path) -> None:
    text = (DATA / "parallel.yaml").read_text().replace("title: loud", "title: length")
    path = tmp_path / "parallel.yaml"
    path.write_text(text)
    code, out, _err = invoke("validate", str(path))
    assert code == 2
    assert (
        "nodes[1].subflows[1]: output 'length' comes from two sub-flows of ParallelFlowNode "
        "'both'; outputs of parallel sub-flows must have distinct names"
    ) in out


def test_a_sub_flow_that_ends_on_several_branches_cannot_have_an_output_named_branch_name(
    tmp_path: Path,
) -> None:
    text = (DATA / "triage.yaml").read_text().replace("title: note", "title: branch_name")
    for old, new in (
        ("output: note", "output: branch_name"),
        ("input: note", "input: branch_name"),
    ):
        text = text.replace(old, new)
    text = text.replace("{{note}}", "{{branch_name}}")
    path = tmp_path / "triage.yaml"
    path.write_text(text)
    code, out, _err = invoke("validate", str(path))
    assert code == 2
    assert (
        "an output named 'branch_name' in a flow that ends on several branches is reserved" in out
    )


def test_a_caught_output_without_a_default_is_refused(tmp_path: Path) -> None:
    text = (DATA / "guarded.yaml").read_text().replace(", default: -1", "")
    path = tmp_path / "guarded.yaml"
    path.write_text(text)
    code, out, _err = invoke("validate", str(path))
    assert code == 2
    assert (
        "nodes[1].outputs: output 'half' of CatchExceptionNode 'guard' needs a default: "
        "it is the value when the sub-flow fails"
    ) in out
