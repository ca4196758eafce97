"""Translate Agent Spec tools and agents into agentflows tools and Agent specs.

A ServerTool is executed by the runtime, so it needs an implementation: agentflows binds it to
the Python script in the tool's ``metadata.agentflows.python`` (JSON arguments on stdin, a JSON
result on stdout, as any python tool). A RemoteTool becomes an http tool, an MCPTool or an
MCPToolBox an mcp tool limited to the tools it names, and a ClientTool a ``client`` tool (each
call pauses the run until the caller gives the result). Placeholders ``{{name}}`` in a
RemoteTool's url, headers and data become ``{{ .args.name }}``.
"""

from __future__ import annotations

from typing import Any
from urllib import parse

from agentflows.agentspec import checks, errors, implementations, mapping, model
from agentflows.api import agent as agent_api
from agentflows.api import documents

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: The client tool an AgentNode's agent (``human_in_the_loop``) asks the user a question with.
ASK_USER_TOOL = "ask_user"


def python_script(
    tool: model.ServerTool,
    path: str,
    out: list[documents.Problem],
    impl: implementations.Implementations = implementations.NONE,
) -> str:
    """The script a ServerTool is bound to: the document's, else the ``--tools`` module's."""
    meta = (tool.metadata or {}).get(mapping.METADATA_KEY)
    script = meta.get("python") if isinstance(meta, dict) else None
    if isinstance(script, str) and script.strip():
        return script
    found = impl.script(tool.name) or impl.unimplemented(tool.name)
    if found is not None:
        return found
    out.append(
        errors.problem(
            f"{path}.metadata.{mapping.METADATA_KEY}.python",
            f"ServerTool {tool.name!r} has no implementation: give a function {tool.name} "
            "in a --tools module, or set this to a Python script (JSON arguments on stdin, "
            "a JSON result on stdout)",
        )
    )
    return "raise SystemExit(1)"


def _args_template(value: Any) -> Any:
    if isinstance(value, str):
        return mapping.substitute(value, _ArgNames(), "{{ .args.%s }}")
    if isinstance(value, dict):
        return {k: _args_template(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_args_template(v) for v in value]
    return value


class _ArgNames(dict[str, str]):
    """Every placeholder name binds to itself (``{{x}}`` -> ``{{ .args.x }}``)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return key


def http_tool(
    tool: model.RemoteTool | model.ApiNode, path: str, out: list[documents.Problem]
) -> agent_api.HttpTool:
    """An http tool for a RemoteTool or an ApiNode."""
    method = tool.http_method.upper()
    if method not in _METHODS:
        out.append(
            errors.problem(
                f"{path}.http_method", f"{tool.http_method!r}: one of {', '.join(_METHODS)}"
            )
        )
        method = "GET"
    if tool.sensitive_headers:
        out.append(
            errors.problem(
                f"{path}.sensitive_headers",
                "secret header values in the document are refused (they would be kept in the "
                "resources); leave them out and give the imported tool secretHeaders from a "
                "Secret",
            )
        )
    url = _args_template(tool.url)
    if method == "GET":
        _query_as_arguments(tool.query_params, f"{path}.query_params", out)
    elif tool.query_params:
        pairs = [f"{parse.quote(k)}={_args_template(v)}" for k, v in tool.query_params.items()]
        url += ("&" if "?" in url else "?") + "&".join(pairs)
    hosts = [parse.urlsplit(u).hostname or u for u in tool.url_allow_list or []]
    return agent_api.HttpTool(
        method=method,
        url=url,
        headers={k: str(_args_template(v)) for k, v in tool.headers.items()},
        body=_args_template(tool.data) if tool.data not in (None, {}) else None,
        allow_hosts=hosts,
    )


def _query_as_arguments(params: dict[str, Any], path: str, out: list[documents.Problem]) -> None:
    """A GET sends the arguments its URL does not use as the query: ``{k: "{{k}}"}`` only."""
    for key, value in params.items():
        if checks.PLACEHOLDER.fullmatch(str(value)) is None or checks.placeholders(value) != [key]:
            out.append(
                errors.problem(
                    f"{path}.{key}",
                    f"{value!r}: a GET's query parameter is an input of the same name "
                    f"({key}: '{{{{{key}}}}}'); other values are not supported yet",
                )
            )


def prefix_names(
    component: model.McpTool | model.McpToolBox, path: str, out: list[documents.Problem]
) -> bool:
    """``metadata.agentflows.prefixNames`` of an MCP tool or toolbox (false when absent).

    Agent Spec offers MCP tools under their own names; ``export`` writes ``true`` for an
    agentflows mcp tool that prefixes them (its default), so importing it again keeps it so.
    """
    meta = (component.metadata or {}).get(mapping.METADATA_KEY)
    value = meta.get(PREFIX_NAMES, False) if isinstance(meta, dict) else False
    if not isinstance(value, bool):
        out.append(
            errors.problem(
                f"{path}.metadata.{mapping.METADATA_KEY}.{PREFIX_NAMES}",
                f"{value!r} is not a boolean: true offers each tool as <tool name>_<server "
                "tool name>, false (the default) under the server tool's own name",
            )
        )
        return False
    return value


#: The metadata key saying an MCP tool's names are prefixed (agentflows' ``mcp.prefixNames``).
PREFIX_NAMES = "prefixNames"


def mcp(
    transport: model.StdioTransport | model.StreamableHttpTransport,
    include: list[str],
    path: str,
    out: list[documents.Problem],
    prefix: bool = False,
) -> agent_api.McpTool:
    """An mcp tool's server for a transport, limited to the ``include``d tools."""
    timeout = transport.session_parameters.read_timeout_seconds
    if isinstance(transport, model.StdioTransport):
        if transport.cwd:
            out.append(
                errors.problem(
                    f"{path}.cwd",
                    "a working directory is not supported; leave cwd out (the server starts "
                    "where the runner runs)",
                )
            )
        return agent_api.McpTool(
            command=transport.command,
            args=transport.args,
            env=transport.env or {},
            include=include,
            timeout_seconds=timeout,
            prefix_names=prefix,
        )
    for name in ("headers", "sensitive_headers", "auth"):
        if getattr(transport, name):
            out.append(
                errors.problem(
                    f"{path}.{name}",
                    "MCP headers and auth are not supported yet (agentflows takes header "
                    "values from Secrets only); leave them out and give the imported mcp tool "
                    "headers from a Secret",
                )
            )
    sse = transport.component_type == "SSETransport"
    return agent_api.McpTool(
        url=transport.url, sse=sse, include=include, timeout_seconds=timeout, prefix_names=prefix
    )


def tool(
    spec: model.ServerTool | model.RemoteTool | model.McpTool | model.ClientTool,
    name: str,
    path: str,
    out: list[documents.Problem],
    impl: implementations.Implementations = implementations.NONE,
) -> agent_api.Tool:
    """An Agent's tool for an Agent Spec tool."""
    common: dict[str, Any] = {
        "name": name,
        "description": spec.description or "",
        "read_only": not spec.requires_confirmation,
    }
    if isinstance(spec, model.McpTool):
        prefix = prefix_names(spec, path, out)
        server = mcp(spec.client_transport, [spec.name], f"{path}.client_transport", out, prefix)
        return agent_api.Tool(**common, mcp=server)
    common["parameters"] = mapping.object_schema(spec.inputs or [])
    if isinstance(spec, model.RemoteTool):
        return agent_api.Tool(**common, http=http_tool(spec, path, out))
    if isinstance(spec, model.ClientTool):
        confirm = spec.requires_confirmation
        return agent_api.Tool(**common, client=agent_api.ClientTool(confirm=confirm))
    return agent_api.Tool(
        **common, python=agent_api.PythonTool(script=python_script(spec, path, out, impl))
    )


def toolbox(
    box: model.McpToolBox, name: str, path: str, out: list[documents.Problem]
) -> agent_api.Tool:
    """An mcp tool for an MCPToolBox, limited to its filter."""
    include = [f if isinstance(f, str) else f.name for f in box.tool_filter or []]
    if any(not isinstance(f, str) and f.requires_confirmation for f in box.tool_filter or []):
        out.append(
            errors.problem(
                f"{path}.tool_filter",
                "requires_confirmation on one tool of a toolbox is not supported; "
                "set it on the toolbox",
            )
        )
    prefix = prefix_names(box, path, out)
    server = mcp(box.client_transport, include, f"{path}.client_transport", out, prefix)
    return agent_api.Tool(
        name=name,
        description=box.description or "",
        read_only=not box.requires_confirmation,
        mcp=server,
    )


def agent_spec(
    agent: model.Agent,
    path: str,
    out: list[documents.Problem],
    impl: implementations.Implementations = implementations.NONE,
) -> agent_api.AgentSpec:
    """Our Agent spec: placeholders of the system prompt read ``<name>``, given in the prompt."""
    names: set[str] = set()
    at = f"{path}." if path else ""
    _distinct_mcp_names(agent.tools, at, out)
    tools = [
        tool(t, mapping.identifier(t.name, names), f"{at}tools[{i}]", out, impl)
        for i, t in enumerate(agent.tools)
    ]
    tools += [
        toolbox(b, mapping.identifier(b.name, names), f"{at}toolboxes[{i}]", out)
        for i, b in enumerate(agent.toolboxes)
    ]
    system = mapping.substitute(
        agent.system_prompt, {n: n for n in checks.placeholders(agent.system_prompt)}, "<%s>"
    )
    return agent_api.AgentSpec(
        model=mapping.model_spec(agent.llm_config, f"{at}llm_config", out),
        system_prompt=system,
        tools=tools,
    )


def _distinct_mcp_names(tools: list[Any], at: str, out: list[documents.Problem]) -> None:
    """An MCPTool is offered under its own name: refuse a tool of the agent with the same one.

    Refused rather than renamed: the prompt and the other runtimes call the tool by its name.
    """
    first: dict[str, int] = {}
    for index, spec in enumerate(tools):
        if spec.name in first and any(
            isinstance(tools[i], model.McpTool) for i in (first[spec.name], index)
        ):
            out.append(
                errors.problem(
                    f"{at}tools[{index}]",
                    f"{spec.name!r} is also the name of {at}tools[{first[spec.name]}]; an "
                    "MCPTool is offered to the model under its own name, so the tools of an "
                    "agent need distinct names",
                )
            )
        first.setdefault(spec.name, index)


def needs_confirmation(agent: model.Agent) -> bool:
    """True when a tool of the agent asks a human to confirm each call."""
    return any(t.requires_confirmation for t in [*agent.tools, *agent.toolboxes])


def ask_user_tool() -> agent_api.Tool:
    """The client tool an agent in a flow asks the user with; the answer is the result."""
    return agent_api.Tool(
        name=ASK_USER_TOOL,
        description="Ask the user a question and wait for the answer. Use it when you need "
        "something only the user knows; otherwise answer directly.",
        parameters={
            "type": "object",
            "properties": {"question": {"type": "string", "description": "The question."}},
            "required": ["question"],
            "additionalProperties": False,
        },
        read_only=True,
        client=agent_api.ClientTool(),
    )


def asks_user(spec: agent_api.AgentSpec | None) -> bool:
    """True when the Agent has the ``ask_user`` client tool."""
    tools = spec.tools if spec is not None else []
    return any(t.client is not None and t.name == ASK_USER_TOOL for t in tools)
