"""The capability protocols a host passes to the engine, and the values that cross them.

The engine calls out for everything that touches the world: agent turns, single model calls,
tool calls, and the Agent/Flow definitions that nodes name. A host (the CLI, the runner pod,
the dry-run mock) implements :class:`Capabilities`. Results come back as :class:`NodeResult`;
a capability that needs a human before it can go on returns :class:`Pause` instead, and is
called again with ``ctx.resume`` set once the request is decided. A capability may also keep
progress on the node's Running record (``ctx.save_progress``, e.g. an agent turn handed to
another Agent): if its runner is killed before the node ends, the next execution is given it
as ``ctx.progress`` and goes on from there instead of starting afresh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentflows.api import agent as agent_api
from agentflows.api import common, errors
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api

#: Sub-flow and sub-agent nesting deeper than this fails (docs/architecture.md, invariants).
MAX_DEPTH = 5


@dataclasses.dataclass
class NodeResult:
    """What a capability produced: the output envelope, usage, and a kind-specific record."""

    output: dict[str, Any]
    usage: common.Usage = dataclasses.field(default_factory=common.Usage)
    #: JSON-able detail kept on the node (tool call records, compressions), bounded by the host.
    detail: Any = None


@dataclasses.dataclass
class Pause:
    """A capability needs a human: persist ``request`` and ``state``, end the run Waiting."""

    request: flowrun_api.HumanRequest
    #: JSON-able state needed to continue (e.g. the paused agent's conversation).
    state: Any
    usage: common.Usage = dataclasses.field(default_factory=common.Usage)
    detail: Any = None


@dataclasses.dataclass
class Resume:
    """Given to a capability called again after its pause: the saved state and the decision."""

    state: Any
    request: flowrun_api.HumanRequest


#: Runs a named Flow inside the current run (for call_sub_flow); returns the sub-run's output.
SubFlowRunner = Callable[[str, Any, "NodeContext"], Awaitable[Any]]
#: Keeps JSON-able progress on the node's Running record (see module docstring).
ProgressSaver = Callable[[Any], Awaitable[None]]
#: Runs a node of the caller's Flow once with the agent's arguments (a node tool); returns the
#: node's output envelope.
NodeToolRunner = Callable[[str, dict[str, Any], "NodeContext"], Awaitable[dict[str, Any]]]


@dataclasses.dataclass
class NodeContext:
    """Everything a capability may know about where it is called from."""

    run_name: str
    #: Status key of the node, with sub-flow prefixes (``review/fix``) and map indexes.
    node_key: str
    #: Nesting depth of sub-flows and sub-agents (0 at top level).
    depth: int
    autonomy: flow_api.Autonomy
    #: Set when the node paused before and its request is now decided.
    resume: Resume | None = None
    #: Runs a named Flow inside this run (sub-flows called by agents).
    run_flow: SubFlowRunner | None = None
    #: Runs a node of the calling agent's Flow (its nodeTools); None when it offers none.
    run_node: NodeToolRunner | None = None
    #: Remaining budget, for capabilities that can stop early (None: unlimited).
    tokens_left: int | None = None
    cost_left_usd: float | None = None
    #: What an earlier execution of this node saved with ``save_progress`` before it was
    #: stopped (None: start afresh).
    progress: Any = None
    #: Keeps progress on the node's Running record, for an execution after a kill.
    save_progress: ProgressSaver | None = None


@dataclasses.dataclass(frozen=True)
class NodeToolOffer:
    """A node of the Flow offered to an agent as a tool, with the schema of the fields it fills."""

    #: Id of the node (the tool's name before the agent layer makes names unique).
    node: str
    kind: str
    description: str
    #: JSON Schema of the arguments: an object with exactly the listed fields.
    parameters: dict[str, Any]


@dataclasses.dataclass
class AgentTask:
    """Run one agent turn: the Agent's spec and the rendered prompt."""

    agent_name: str
    agent: agent_api.AgentSpec
    prompt: str
    #: Nodes of the Flow the agent may call (run through ``NodeContext.run_node``).
    node_tools: list[NodeToolOffer] = dataclasses.field(default_factory=list)
    #: Reference files of the agent node, added to the Agent's own ``files``.
    files: list[agent_api.ReferenceFile] = dataclasses.field(default_factory=list)
    #: The conversation to continue, as evaluated from the node's (else the Agent's) session.
    session: str | None = None
    #: Separates parallel calls within the session (the node's, else the Agent's, request).
    request: str | None = None
    #: The node's memory settings, overriding the Agent's (``agent.memory``) when set.
    memory: agent_api.Memory | None = None
    #: Offer the turn no tools at all (``tools: {skip: true}`` on the node).
    skip_tools: bool = False
    #: The values the turn must submit to finish (the node's ``agent.answer``), if any.
    answer: flow_api.AgentAnswer | None = None


@dataclasses.dataclass
class LlmTask:
    """One completion."""

    model: agent_api.ModelSpec
    system: str
    prompt: str
    output_schema: Any = None


@dataclasses.dataclass
class ToolTask:
    """One tool call: the tool's definition (from an Agent or inline) and rendered arguments."""

    tool: agent_api.Tool
    #: For MCP tools, the server tool to call (the Tool may expose many).
    tool_name: str
    args: Any


class Resolver(Protocol):
    """Looks up the Agents and Flows that nodes name (from files, or a run's snapshot)."""

    def agent(self, name: str) -> agent_api.AgentSpec | None:
        """The Agent called ``name``, or None when there is none."""
        ...

    def flow(self, name: str) -> flow_api.FlowSpec | None:
        """The Flow called ``name``, or None when there is none."""
        ...


class Capabilities(Protocol):
    """What the engine needs from its host to execute agent, llm and tool nodes."""

    async def run_agent(self, task: AgentTask, ctx: NodeContext) -> NodeResult | Pause:
        """Run an agent turn to its final answer, or pause it for a human."""
        ...

    async def complete(self, task: LlmTask, ctx: NodeContext) -> NodeResult:
        """Make one model call."""
        ...

    async def call_tool(self, task: ToolTask, ctx: NodeContext) -> NodeResult | Pause:
        """Call one tool (or pause when autonomy says a human must approve it)."""
        ...


class CapabilityError(errors.AgentflowsError):
    """A capability failed; ``retryable`` says whether trying the node again may help.

    ``source`` names the service that failed temporarily (a model, a tool, an http endpoint),
    so a node's retry policy can choose which temporary failures it retries.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        source: flow_api.RetryOn | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.source = source
