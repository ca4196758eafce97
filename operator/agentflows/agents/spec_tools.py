"""Tool providers for what a spec declares: ``http``, ``python`` and ``client`` tools, skills.

Built by :mod:`agentflows.agents.host` for each agent turn and each ``tool`` node. Templates are
compiled here, so a bad one fails the node before the model is called. MCP tools are served by
their own provider and are skipped here. A ``client`` tool is only offered: the caller runs it
(:mod:`agentflows.agents.approval` pauses every call to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentflows.agents import handoff, python_tool, secrets, tools
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities

if TYPE_CHECKING:
    from agentflows.agents import http_tool


class SpecToolProvider:
    """The ``http``, ``python`` and ``client`` tools declared in a spec (an Agent's, a node's)."""

    def __init__(
        self, declared: Iterable[agent_api.Tool], env: Mapping[str, str], redactor: secrets.Redactor
    ) -> None:
        self._defs: dict[str, tools.ToolDef] = {}
        self._runners: dict[str, http_tool.HttpToolRunner | python_tool.PythonToolRunner] = {}
        for tool in declared:
            if tool.http is not None:
                from agentflows.agents import http_tool  # httpx loads only when used

                self._runners[tool.name] = http_tool.HttpToolRunner(
                    tool.name, tool.http, env, redactor
                )
            elif tool.python is not None:
                self._runners[tool.name] = python_tool.PythonToolRunner(
                    tool.name, tool.python.script, tool.python.timeout_seconds, env, redactor
                )
            elif tool.client is None:
                # MCP tools come from their own provider; they are not this provider's.
                continue
            self._defs[tool.name] = tools.ToolDef(
                name=tool.name,
                description=tool.description or f"The {tool.kind} tool {tool.name}.",
                parameters=tool.parameters if isinstance(tool.parameters, dict) else None,
                read_only=tool.read_only,
                client=tool.client is not None,
                confirm=tool.client is not None and tool.client.confirm,
            )

    async def list_tools(self) -> list[tools.ToolDef]:
        """Return the declared http and python tools."""
        return list(self._defs.values())

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Run the declared tool ``name``."""
        runner = self._runners.get(name)
        if runner is None and name in self._defs:
            return tools.ToolOutcome.failure(
                f"{name} is a client tool: the caller runs it and gives the result "
                "(decision respond with the result as data)"
            )
        if runner is None:
            return tools.ToolOutcome.failure(f"no tool named {name!r}")
        return await runner.run(args)


class SkillToolProvider:
    """The scripts of an Agent's skills, each offered as tool ``skill_<name>``.

    A skill's content goes into the system prompt (:func:`agentflows.agents.turn.build_messages`);
    its script, when it has one, runs like a ``python`` tool. Scripts are not read-only.
    """

    def __init__(
        self,
        skills: Iterable[agent_api.Skill],
        env: Mapping[str, str],
        redactor: secrets.Redactor,
    ) -> None:
        self._defs: dict[str, tools.ToolDef] = {}
        self._runners: dict[str, python_tool.PythonToolRunner] = {}
        for skill in skills:
            if skill.script is None:
                continue
            name = f"skill_{skill.name}"
            self._runners[name] = python_tool.PythonToolRunner(
                name, skill.script, skill.timeout_seconds, env, redactor
            )
            self._defs[name] = tools.ToolDef(
                name=name,
                description=f"Run the script of the {skill.name} skill (see its instructions).",
                parameters=skill.parameters if isinstance(skill.parameters, dict) else None,
            )

    async def list_tools(self) -> list[tools.ToolDef]:
        """Return one tool per skill with a script."""
        return list(self._defs.values())

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Run the script of skill tool ``name``."""
        runner = self._runners.get(name)
        if runner is None:
            return tools.ToolOutcome.failure(f"no tool named {name!r}")
        return await runner.run(args)


def declared_tool_names(spec: agent_api.AgentSpec) -> list[str]:
    """The names the model is offered that need no connection: everything but MCP tools.

    For the operator's Agent status, next to
    :func:`agentflows.agents.mcp.discover_tools` for each ``mcp`` tool: ``http`` and ``python``
    tools, ``skill_<name>`` per skill with a script, ``call_sub_agent``, ``call_sub_flow`` and
    ``request_human_review`` and ``handoff_conversation`` when the Agent enables them.
    """
    names = [tool.name for tool in spec.tools if tool.mcp is None]
    names += [f"skill_{skill.name}" for skill in spec.skills if skill.script is not None]
    if spec.sub_agents:
        names.append("call_sub_agent")
    if spec.sub_flows:
        names.append("call_sub_flow")
    if spec.human_review is not None and spec.human_review.enabled:
        names.append("request_human_review")
    if spec.handoffs:
        names.append(handoff.HANDOFF_TOOL)
    return names
