"""Every "refused" row of the support matrix (docs/agentspec.md), as ``validate`` and ``run`` say it.

Each document differs from a valid one by the refused component or field; both commands exit 2
with one line naming the field's path and what would be valid, and no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.agentspec.conftest import invoke
from tests.unit.agentspec.test_validation import MODEL, base

STDIO = {"component_type": "StdioTransport", "name": "t", "command": "mcp-server"}
HTTP = {"component_type": "StreamableHTTPTransport", "name": "t", "url": "http://127.0.0.1:1/mcp"}
SSE = {"component_type": "SSETransport", "name": "t", "url": "http://127.0.0.1:1/sse"}
REMOTE = {
    "component_type": "RemoteTool", "name": "lookup", "url": "http://127.0.0.1:1/x",
    "http_method": "POST",
}  # fmt: skip
BOX = {
    "component_type": "MCPToolBox", "name": "b", "client_transport": STDIO,
    "tool_filter": [{"component_type": "MCPToolSpec", "name": "e", "requires_confirmation": True}],
}  # fmt: skip
NODE_AGENT = {"component_type": "Agent", "name": "a", "system_prompt": "x", "llm_config": MODEL}
A2A = {"component_type": "A2AAgent", "name": "reviewer", "agent_url": "http://127.0.0.1:1"}
PREFIX_YES = {"prefixNames": "yes"}
SECRET_HEADERS = (
    "MCP headers and auth are not supported yet (agentflows takes header values from Secrets "
    "only); leave them out and give the imported mcp tool headers from a Secret"
)


def agent(**fields: Any) -> dict[str, Any]:
    """A root Agent with ``fields``."""
    return {
        "agentspec_version": "26.2.0", "component_type": "Agent", "name": "helper",
        "system_prompt": "Help.", "llm_config": dict(MODEL), **fields,
    }  # fmt: skip


def mcp_tool(transport: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return agent(
        tools=[{"component_type": "MCPTool", "name": "m", "client_transport": transport | extra}]
    )


def flow_where(**ask: Any) -> dict[str, Any]:
    """The valid base flow with its LlmNode ``ask`` changed."""
    doc = base()
    doc["$referenced_components"]["ask"].update(ask)
    return doc


def unsupported(kind: str) -> dict[str, Any]:
    return flow_where(component_type=kind)


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "jinja": (
        flow_where(prompt_template="{% if q %}{{q}}{% endif %}"),
        "nodes[1].prompt_template: Jinja statements ({% ... %}) are not supported; "
        "use {{name}} placeholders",
    ),
    "agent_node_branches": (
        flow_where(component_type="AgentNode", branches=["YES"], agent=NODE_AGENT),
        "$referenced_components.ask.branches: an agent choosing the next branch is not "
        "supported; branch on its answer with a BranchingNode",
    ),
    "sensitive_headers": (
        agent(tools=[REMOTE | {"sensitive_headers": {"Authorization": "Bearer x"}}]),
        "tools[0].sensitive_headers: secret header values in the document are refused (they "
        "would be kept in the resources); leave them out and give the imported tool "
        "secretHeaders from a Secret",
    ),
    "query_params": (
        agent(tools=[REMOTE | {"http_method": "GET", "query_params": {"q": "fixed"}}]),
        "tools[0].query_params.q: 'fixed': a GET's query parameter is an input of the same "
        "name (q: '{{q}}'); other values are not supported yet",
    ),
    "transforms": (
        agent(transforms=[{"component_type": "MessageSummarizationTransform", "name": "s"}]),
        "transforms[0].component_type: MessageSummarizationTransform 's' is not supported: "
        "message transforms are not supported; leave the Agent's transforms empty (agentflows "
        "compresses a long conversation itself)",
    ),
    "mcp_prefix_names_not_a_boolean": (
        agent(tools=[{**mcp_tool(STDIO)["tools"][0], "metadata": {"agentflows": PREFIX_YES}}]),
        "tools[0].metadata.agentflows.prefixNames: 'yes' is not a boolean: true offers each "
        "tool as <tool name>_<server tool name>, false (the default) under the server tool's "
        "own name",
    ),
    "stdio_cwd": (
        mcp_tool(STDIO, cwd="/srv"),
        "tools[0].client_transport.cwd: a working directory is not supported; leave cwd out "
        "(the server starts where the runner runs)",
    ),
    "streamable_http_headers": (
        mcp_tool(HTTP, headers={"X-Team": "a"}),
        f"tools[0].client_transport.headers: {SECRET_HEADERS}",
    ),
    "streamable_http_auth": (
        mcp_tool(HTTP, auth={"scheme": "bearer"}),
        f"tools[0].client_transport.auth: {SECRET_HEADERS}",
    ),
    "sse_sensitive_headers": (
        mcp_tool(SSE, sensitive_headers={"X-Key": "k"}),
        f"tools[0].client_transport.sensitive_headers: {SECRET_HEADERS}",
    ),
    "toolbox_tool_confirmation": (
        agent(toolboxes=[BOX]),
        "toolboxes[0].tool_filter: requires_confirmation on one tool of a toolbox is not "
        "supported; set it on the toolbox",
    ),
    "api_key": (
        flow_where(llm_config=MODEL | {"api_key": "sk-written-in-the-document"}),
        "nodes[1].llm_config.api_key: a key written in the document is refused (it would be "
        "kept in the resources); OpenAiConfig reads OPENAI_API_KEY, an OpenAI-compatible "
        "endpoint needs none",
    ),
    "api_type": (
        flow_where(llm_config=MODEL | {"api_type": "responses"}),
        "$referenced_components.ask.llm_config.api_type: Input should be 'chat_completions'",
    ),
    "a2a_agent_at_the_root": (
        {"agentspec_version": "26.2.0", **A2A},
        "component_type: the document's root is a A2AAgent; agentflows runs a Flow, an Agent, "
        "a SpecializedAgent, a ManagerWorkers or a Swarm",
    ),
    "a2a_agent_as_a_worker": (
        {
            "agentspec_version": "26.2.0",
            "component_type": "ManagerWorkers",
            "name": "team",
            "group_manager": {k: v for k, v in agent().items() if k != "agentspec_version"},
            "workers": [A2A],
        },
        "workers[0]: Input tag 'A2AAgent' found using 'component_type' does not match any of "
        "the expected tags: 'Agent', 'SpecializedAgent', 'ManagerWorkers'",
    ),
}
UNSUPPORTED = {
    "RemoteAgent": "RemoteAgent is abstract; use A2AAgent",
    "OciAgent": "OCI agents are not supported; use an Agent, or an A2AAgent for a remote one",
    "BuiltinTool": "builtin tools are not supported; use a ServerTool, a RemoteTool or an MCPTool",
    "OciGenAiConfig": "OCI Generative AI models are not mapped yet; use an "
    "OpenAiCompatibleConfig with an OpenAI-compatible endpoint",
    "GeminiConfig": "Gemini models are not mapped yet; use an OpenAiCompatibleConfig with "
    "Gemini's OpenAI-compatible endpoint",
    "DbmsVectorChainLlmConfig": "DBMS vector-chain models are not supported; use an "
    "OpenAiCompatibleConfig, a VllmConfig or an OllamaConfig",
    "SSEmTLSTransport": "MCP with mTLS is not supported; use an SSETransport",
    "StreamableHTTPmTLSTransport": "MCP with mTLS is not supported; use a StreamableHTTPTransport",
    "ConversationSummarizationTransform": "message transforms are not supported; leave the "
    "Agent's transforms empty (agentflows compresses a long conversation itself)",
    "InMemoryCollectionDatastore": "datastores are not supported; reach the data through a tool",
    "OracleDatabaseDatastore": "datastores are not supported; reach the data through a tool",
    "PostgresDatabaseDatastore": "datastores are not supported; reach the data through a tool",
}
REFUSED |= {
    kind: (
        unsupported(kind),
        f"$referenced_components.ask.component_type: {kind} 'ask' is not supported: {reason}",
    )
    for kind, reason in UNSUPPORTED.items()
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_component_or_field_exits_2_naming_its_path_and_what_is_valid(
    tmp_path: Path, case: str, command: str
) -> None:
    doc, line = REFUSED[case]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    extra = ["--state-dir", str(tmp_path / "runs")] if command == "run" else []
    code, out, err = invoke(command, str(path), *extra)
    said = out + err
    assert code == 2, said
    assert f"{path}: {line}\n" in said
    assert "Traceback" not in said
    assert not (tmp_path / "runs").exists(), "nothing ran"
