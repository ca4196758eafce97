"""``agentflows import`` and ``export``: what each component becomes, refusals, round trips."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.agentspec.conftest import DATA, invoke
from tests.unit.agentspec.test_validation import base

DOCUMENTS = sorted(p.name for p in DATA.iterdir())


def imported(path: Path) -> dict[tuple[str, str], Any]:
    """``agentflows import``'s resources by (kind, name)."""
    code, out, err = invoke("import", str(path))
    assert code == 0, err
    return {(d["kind"], d["metadata"]["name"]): d["spec"] for d in yaml.safe_load_all(out)}


@pytest.mark.parametrize("name", DOCUMENTS)
def test_import_export_import_gives_the_same_resources(name: str, tmp_path: Path) -> None:
    first = tmp_path / "first.yaml"
    code, out, err = invoke("import", str(DATA / name))
    assert code == 0, err
    first.write_text(out)
    code, spec, err = invoke("export", str(first))
    assert code == 0, err
    assert yaml.safe_load(spec)["agentspec_version"] == "26.2.0"
    exported = tmp_path / "exported.yaml"
    exported.write_text(spec)
    code, again, err = invoke("import", str(exported))
    assert code == 0, err
    assert again == out


def test_export_as_json_reads_back_as_the_same_resources(tmp_path: Path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text(invoke("import", str(DATA / "digest.yaml"))[1])
    code, spec, err = invoke("export", str(first), "--format", "json")
    assert code == 0, err
    (tmp_path / "digest.json").write_text(spec)
    resources = yaml.safe_load_all(first.read_text())
    expected = {(d["kind"], d["metadata"]["name"]): d["spec"] for d in resources}
    assert imported(tmp_path / "digest.json") == expected


def test_mcp_tools_toolboxes_and_remote_tools_map_to_agent_tools() -> None:
    resources = imported(DATA / "mcp_tools.json")
    tools = {t["name"]: t for t in resources[("Agent", "ops-assistant")]["tools"]}
    assert tools["list_pods"] == {
        "name": "list_pods",
        "readOnly": True,
        "mcp": {
            "command": "kube-mcp",
            "args": ["--read-only"],
            "include": ["list_pods"],
            "prefixNames": False,
        },
    }
    assert tools["docs"]["mcp"] == {
        "url": "https://docs.example.com/mcp",
        "include": ["search", "fetch"],
        "prefixNames": False,
    }
    ticket = tools["open_ticket"]
    assert "readOnly" not in ticket
    assert ticket["http"] == {
        "method": "POST",
        "url": "https://tickets.example.com/api/{{ .args.queue }}",
        "body": {"title": "{{ .args.title }}"},
    }
    assert resources[("Flow", "ops-assistant")]["autonomy"] == "supervised"


def test_llm_configs_become_openai_compatible_model_strings(tmp_path: Path) -> None:
    doc = base()
    doc["$referenced_components"]["ask"]["llm_config"] = {
        "component_type": "OllamaConfig", "name": "local", "model_id": "llama3.2",
        "url": "localhost:11434", "default_generation_parameters": {"temperature": 0.1, "top_p": 0.9},
    }  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    flow = imported(path)[("Flow", "base")]
    assert flow["nodes"][1]["llm"]["model"] == {
        "name": "openai/llama3.2",
        "apiBase": "http://localhost:11434/v1",
        "temperature": 0.1,
        "topP": 0.9,
    }


def refused(doc: dict[str, Any], tmp_path: Path) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    code, out, err = invoke("import", str(path))
    assert code == 2, out + err
    assert out == ""
    return err


def test_a_key_written_in_the_document_is_refused_and_not_echoed(tmp_path: Path) -> None:
    doc = base()
    doc["$referenced_components"]["ask"]["llm_config"] = {
        **doc["$referenced_components"]["ask"]["llm_config"], "api_key": "sk-secret-123",
    }  # fmt: skip
    err = refused(doc, tmp_path)
    assert "nodes[1].llm_config.api_key: a key written in the document is refused" in err
    assert "sk-secret-123" not in err


def test_a_server_tool_without_an_implementation_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["$referenced_components"]["ask"] = {
        "component_type": "ToolNode", "name": "ask",
        "tool": {"component_type": "ServerTool", "name": "lookup", "inputs": [{"title": "q"}]},
    }  # fmt: skip
    doc["data_flow_connections"] = [doc["data_flow_connections"][0]]
    err = refused(doc, tmp_path)
    assert (
        "nodes[1].tool.metadata.agentflows.python: ServerTool 'lookup' has no implementation"
    ) in err


def test_an_input_with_no_data_edge_and_no_default_is_refused(tmp_path: Path) -> None:
    doc = base()
    doc["data_flow_connections"] = [doc["data_flow_connections"][1]]
    err = refused(doc, tmp_path)
    assert "nodes[1]: input 'q' of LlmNode 'ask' is not connected" in err


def test_an_mcp_tool_over_mtls_in_a_tool_node_is_refused_naming_the_transport(
    tmp_path: Path,
) -> None:
    doc = base()
    doc["$referenced_components"]["ask"] = {
        "component_type": "ToolNode", "name": "ask",
        "tool": {
            "component_type": "MCPTool", "name": "search",
            "client_transport": {"component_type": "SSEmTLSTransport", "name": "s", "url": "http://x"},
        },
    }  # fmt: skip
    doc["data_flow_connections"] = []
    doc["$referenced_components"]["end"]["outputs"][0]["default"] = ""
    err = refused(doc, tmp_path)
    assert (
        "ask.tool.client_transport.component_type: SSEmTLSTransport 's' is not supported: "
        "MCP with mTLS is not supported"
    ) in err


def test_export_refuses_a_jq_transform_with_its_path(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: f}\n"
        "spec:\n  nodes:\n  - {id: a, transform: '=.run.input'}\n"
        "  - {id: b, transform: '=[1, 2] | add'}\n  edges: [{from: a, to: b}]\n"
    )
    code, out, err = invoke("export", str(flow))
    assert code == 2
    assert out == ""
    assert "spec.nodes[0].transform: a jq transform has no Agent Spec equivalent" in err
    assert "spec.nodes[1].transform: a jq transform has no Agent Spec equivalent" in err


def test_export_refuses_node_tools_and_reference_files_instead_of_dropping_them(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        "apiVersion: agentflows.io/v1alpha1\nkind: Agent\nmetadata: {name: helper}\n"
        "spec: {model: {name: openai/gpt-4o}, files: [{path: faq.md}]}\n---\n"
        "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: f}\n"
        "spec:\n  nodes:\n  - id: ask\n    agent: {name: helper, prompt: Begin.,"
        " nodeTools: [{node: t}], files: [{path: faq.md}]}\n"
        "  - {id: t, transform: '=1'}\n"
    )
    code, out, err = invoke("export", str(flow))
    assert code == 2
    assert out == ""
    assert "agent.nodeTools: nodeTools have no Agent Spec equivalent" in err
    assert "agent.files: files have no Agent Spec equivalent" in err
    assert "Agent helper: files have no Agent Spec equivalent" in err


def agentflows_metadata(document: Any) -> list[Any]:
    """Every component's ``metadata.agentflows`` in a document, in document order."""
    found: list[Any] = []
    if isinstance(document, dict):
        meta = document.get("metadata")
        if "component_type" in document and isinstance(meta, dict) and "agentflows" in meta:
            found.append(meta["agentflows"])
        for value in document.values():
            found += agentflows_metadata(value)
    elif isinstance(document, list):
        for value in document:
            found += agentflows_metadata(value)
    return found


@pytest.mark.parametrize("name", DOCUMENTS)
def test_export_keeps_the_agentflows_metadata_import_read(name: str, tmp_path: Path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text(invoke("import", str(DATA / name))[1])
    code, spec, err = invoke("export", str(first))
    assert code == 0, err
    exported = agentflows_metadata(yaml.safe_load(spec))
    for meta in agentflows_metadata(yaml.safe_load((DATA / name).read_text())):
        assert meta in exported
        exported.remove(meta)


MCP_DOCUMENTS = [n for n in DOCUMENTS if "MCPTool" in (DATA / n).read_text()]


@pytest.mark.parametrize("name", MCP_DOCUMENTS)
def test_mcp_tools_offered_with_prefixed_names_stay_prefixed_through_export_and_import(
    name: str, tmp_path: Path
) -> None:
    # An Agent written for agentflows prefixes its MCP tools' names (prefixNames' default);
    # exported and imported again, it must not start offering them under their own names.
    code, out, err = invoke("import", str(DATA / name))
    assert code == 0, err
    assert "prefixNames: false" in out
    resources = tmp_path / "prefixed.yaml"
    resources.write_text(re.sub(r"\n *prefixNames: false", "", out))  # the default: true
    code, spec, err = invoke("export", str(resources))
    assert code == 0, err
    assert {"prefixNames": True} in agentflows_metadata(yaml.safe_load(spec))
    exported = tmp_path / "exported.yaml"
    exported.write_text(spec)
    code, again, err = invoke("import", str(exported))
    assert code == 0, err
    assert again == resources.read_text()


def test_export_refuses_an_agent_node_history_other_than_the_flow_s_conversation(
    tmp_path: Path,
) -> None:
    code, out, err = invoke("import", str(DATA / "support_chat.yaml"))
    assert code == 0, err
    assert "history: '=[(if .nodes.ask then" in out
    resources = tmp_path / "resources.yaml"
    resources.write_text(
        re.sub(r"history: '=\[\(if .*", """history: '=[{"role": "user", "content": "hi"}]'""", out)
    )
    code, out, err = invoke("export", str(resources))
    assert code == 2, out
    assert (
        "spec.nodes[3].agent.history: only the flow's conversation (as import writes it) has an "
        "Agent Spec equivalent: an AgentNode sees the messages before it; leave history out"
    ) in err
