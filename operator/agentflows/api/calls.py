"""What a Flow reaches: the Agents and Flows it calls, and theirs in turn — the one walk.

:func:`calls` lists what a Flow's nodes name, :func:`agent_calls` what an Agent names, and
:func:`reach` follows both from a Flow through a :class:`Lookup`. Each :class:`Call` says
how it is made (:attr:`Call.via`), so every caller filters on purpose:

- ``agent`` — an agent node (or a map node's ``agent``) runs the Agent's turn;
- ``tool`` — a tool node (or a map node's ``tool``) with ``agent`` calls one tool of that
  Agent's definition: the Agent's model, sub-agents and sub-flows never run;
- ``flow`` — a flow node (or a map node's ``flow``) runs the sub-flow;
- ``subAgents``, ``handoffs``, ``subFlows`` — what an Agent's turn may call.

A tool node's Agent *counts as a reference* — its definition must exist and travel with the
run — but *does not run*: :attr:`Call.runs` is False for it. So the run's snapshot
(:mod:`agentflows.api.snapshot`), the Flow's Ready check (:mod:`agentflows.controller.resolve`)
and the cache's referrer index (:mod:`agentflows.controller.cache`) take every call, while the
call-cycle check (:mod:`agentflows.engine.graph`) and the models a local run needs keys for
(:mod:`agentflows.cli.local`) follow only the calls that run.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, Protocol

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api

AGENT = "Agent"
FLOW = "Flow"


class Via(enum.StrEnum):
    """How a call is made: the field naming the callee (see the module docstring)."""

    AGENT = "agent"
    TOOL = "tool"
    FLOW = "flow"
    SUB_AGENTS = "subAgents"
    HANDOFFS = "handoffs"
    SUB_FLOWS = "subFlows"


@dataclasses.dataclass(frozen=True)
class Call:
    """One Agent or Flow named: its kind, its name, how it is called and the naming field."""

    kind: str
    name: str
    via: Via
    #: The field naming it, e.g. ``spec.nodes[2].map.agent.name`` or ``spec.subFlows[0]``.
    path: str

    @property
    def runs(self) -> bool:
        """Whether the callee runs (its model, sub-agents, sub-flows): all but a tool node's."""
        return self.via != Via.TOOL

    @property
    def ref(self) -> tuple[str, str]:
        """``(kind, name)``."""
        return self.kind, self.name


def node_calls(node: flow_api.Node, path: str) -> list[Call]:
    """What one node calls; ``path`` is the node's (``spec.nodes[3]``)."""
    found: list[Call] = []
    for body, where in ((node, path), (node.map, f"{path}.map")):
        if body is None:
            continue
        if body.agent is not None:
            found.append(Call(AGENT, body.agent.name, Via.AGENT, f"{where}.agent.name"))
        if body.tool is not None and body.tool.agent is not None:
            found.append(Call(AGENT, body.tool.agent, Via.TOOL, f"{where}.tool.agent"))
        if body.flow is not None:
            found.append(Call(FLOW, body.flow.name, Via.FLOW, f"{where}.flow.name"))
    return found


def calls(flow: flow_api.FlowSpec) -> list[Call]:
    """Every Agent and Flow a Flow's nodes name, in node order."""
    found: list[Call] = []
    for index, node in enumerate(flow.nodes):
        found += node_calls(node, f"spec.nodes[{index}]")
    return found


def agent_calls(agent: agent_api.AgentSpec) -> list[Call]:
    """Every Agent and Flow an Agent's turn may call: sub-agents, handoffs, sub-flows."""
    return [
        *(
            Call(AGENT, n, Via.SUB_AGENTS, f"spec.subAgents[{i}]")
            for i, n in enumerate(agent.sub_agents)
        ),
        *(
            Call(AGENT, n, Via.HANDOFFS, f"spec.handoffs[{i}]")
            for i, n in enumerate(agent.handoffs)
        ),
        *(
            Call(FLOW, n, Via.SUB_FLOWS, f"spec.subFlows[{i}]")
            for i, n in enumerate(agent.sub_flows)
        ),
    ]


class Lookup(Protocol):
    """Finds Agents and Flows by name (a namespace's cache, loaded files, a snapshot)."""

    def agent(self, name: str) -> agent_api.AgentSpec | None:
        """The Agent called ``name``, or None."""
        ...

    def flow(self, name: str) -> flow_api.FlowSpec | None:
        """The Flow called ``name``, or None."""
        ...


@dataclasses.dataclass
class Reach:
    """The Flows and Agents a Flow reaches, and what it names that does not exist."""

    flows: dict[str, flow_api.FlowSpec]
    agents: dict[str, agent_api.AgentSpec]
    #: ``Kind/name`` of each one named but not found (the root Flow too), in walk order.
    missing: list[str]


def every(call: Call) -> bool:
    """Follow every call (the default of :func:`reach`)."""
    return True


def running(call: Call) -> bool:
    """Follow only the calls that run their callee (:attr:`Call.runs`)."""
    return call.runs


def reach(flow: str, lookup: Lookup, follow: Callable[[Call], bool] = every) -> Reach:
    """Walk from Flow ``flow`` over every call ``follow`` keeps, transitively.

    Depth first, Flows before Agents; a Flow's callees are pushed in name order, an Agent's in
    the order it declares them.
    """
    out = Reach(flows={}, agents={}, missing=[])
    stacks: dict[str, list[str]] = {FLOW: [flow], AGENT: []}
    while stacks[FLOW] or stacks[AGENT]:
        kind = FLOW if stacks[FLOW] else AGENT
        name = stacks[kind].pop()
        found: dict[str, Any] = out.flows if kind == FLOW else out.agents
        if name in found:
            continue
        spec = lookup.flow(name) if kind == FLOW else lookup.agent(name)
        if spec is None:
            out.missing.append(f"{kind}/{name}")
            continue
        found[name] = spec
        named = calls(spec) if isinstance(spec, flow_api.FlowSpec) else agent_calls(spec)
        kept = [call for call in named if follow(call)]
        for callee in (AGENT, FLOW):
            names = dict.fromkeys(call.name for call in kept if call.kind == callee)
            stacks[callee] += sorted(names) if kind == FLOW else list(names)
    return out
