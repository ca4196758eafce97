"""Typed Agent Spec components (the supported subset), read from a resolved document.

Field names are the specification's (snake_case). Unknown fields are refused, so a misspelled
``prompt_templat`` is reported at its path instead of being dropped. Properties (``inputs``,
``outputs``) stay JSON Schema mappings; :mod:`.document` has checked their titles.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from agentflows.agentspec import document, errors
from agentflows.api import documents

Property = dict[str, Any]
#: The component types this module types (pydantic names union members by them in errors).
_TYPES = document.SUPPORTED
#: The branch a node that does not branch leaves on.
NEXT = "next"
#: The branch a BranchingNode takes when its input matches no key of ``mapping``.
DEFAULT_BRANCH = "default"


class Component(pydantic.BaseModel):
    """Fields every component has."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    id: str = ""
    name: str = Field(min_length=1)
    description: str | None = None
    metadata: dict[str, Any] | None = None


class WithIO(Component):
    """A component with input and output properties."""

    inputs: list[Property] | None = None
    outputs: list[Property] | None = None


class GenerationParameters(pydantic.BaseModel):
    """``default_generation_parameters`` of an LLM config."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


class RetryPolicy(pydantic.BaseModel):
    """A retry policy (read; only max_attempts and request_timeout are mapped)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=2, ge=0)
    request_timeout: float | None = Field(default=None, gt=0)
    initial_retry_delay: float = Field(default=1.0, ge=0)
    max_retry_delay: float = Field(default=8.0, ge=0)


class _LlmConfig(Component):
    model_id: str = Field(min_length=1)
    api_key: str | None = None
    default_generation_parameters: GenerationParameters | None = None
    retry_policy: RetryPolicy | None = None
    api_type: Literal["chat_completions"] = "chat_completions"


class OpenAiConfig(_LlmConfig):
    """A model of OpenAI's own API."""

    component_type: Literal["OpenAiConfig"]
    provider: Literal["openai"] | None = None
    api_provider: Literal["openai"] | None = None
    url: str | None = None


class OpenAiCompatibleConfig(_LlmConfig):
    """A model behind an OpenAI-compatible endpoint at ``url``."""

    component_type: Literal["OpenAiCompatibleConfig", "VllmConfig", "OllamaConfig"]
    provider: str | None = None
    api_provider: str | None = None
    url: str = Field(min_length=1)


LlmConfig = Annotated[OpenAiConfig | OpenAiCompatibleConfig, Field(discriminator="component_type")]


class _Tool(WithIO):
    requires_confirmation: bool = False


class ServerTool(_Tool):
    """A tool the runtime executes; bound to a Python script through ``metadata.agentflows``."""

    component_type: Literal["ServerTool"]


class RemoteTool(_Tool):
    """An HTTP endpoint called with the tool's inputs."""

    component_type: Literal["RemoteTool"]
    url: str = Field(min_length=1)
    http_method: str = Field(min_length=1)
    api_spec_uri: str | None = None
    data: Any = None
    query_params: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, Any] = Field(default_factory=dict)
    sensitive_headers: dict[str, Any] | None = None
    url_allow_list: list[str] | None = None
    retry_policy: RetryPolicy | None = None


class SessionParameters(pydantic.BaseModel):
    """MCP session parameters."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    read_timeout_seconds: float = Field(default=60.0, gt=0)


class StdioTransport(Component):
    """An MCP server started as a subprocess."""

    component_type: Literal["StdioTransport"]
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    session_parameters: SessionParameters = Field(default_factory=SessionParameters)


class StreamableHttpTransport(Component):
    """An MCP server reached over streamable HTTP (or the older HTTP+SSE transport)."""

    component_type: Literal["StreamableHTTPTransport", "SSETransport"]
    url: str = Field(min_length=1)
    auth: Any = None
    headers: dict[str, str] | None = None
    sensitive_headers: dict[str, str] | None = None
    retry_policy: RetryPolicy | None = None
    session_parameters: SessionParameters = Field(default_factory=SessionParameters)


Transport = Annotated[
    StdioTransport | StreamableHttpTransport, Field(discriminator="component_type")
]


class McpTool(_Tool):
    """One tool of an MCP server."""

    component_type: Literal["MCPTool"]
    client_transport: Transport
    retry_policy: RetryPolicy | None = None


class McpToolSpec(WithIO):
    """A tool named in an MCP toolbox's filter."""

    component_type: Literal["MCPToolSpec"]
    requires_confirmation: bool = False


class McpToolBox(Component):
    """Every tool (or the filtered ones) of an MCP server."""

    component_type: Literal["MCPToolBox"]
    client_transport: Transport
    requires_confirmation: bool = False
    retry_policy: RetryPolicy | None = None
    tool_filter: list[str | McpToolSpec] | None = None


class ClientTool(_Tool):
    """A tool the caller executes: the run pauses with the call and goes on with its result."""

    component_type: Literal["ClientTool"]


Tool = Annotated[
    ServerTool | RemoteTool | McpTool | ClientTool, Field(discriminator="component_type")
]


class Agent(WithIO):
    """An LLM agent with a system prompt and tools."""

    component_type: Literal["Agent"]
    llm_config: LlmConfig
    system_prompt: str
    tools: list[Tool] = Field(default_factory=list)
    toolboxes: list[McpToolBox] = Field(default_factory=list)
    human_in_the_loop: bool = True
    transforms: list[Any] = Field(default_factory=list, max_length=0)


class AgentSpecializationParameters(WithIO):
    """What a SpecializedAgent adds to its agent."""

    component_type: Literal["AgentSpecializationParameters"]
    additional_instructions: str | None = None
    additional_tools: list[Tool] | None = None
    human_in_the_loop: bool | None = None


class SpecializedAgent(WithIO):
    """An Agent with more instructions and tools: agentflows merges them into one Agent."""

    component_type: Literal["SpecializedAgent"]
    agent: Agent
    agent_specialization_parameters: AgentSpecializationParameters


class ManagerWorkers(WithIO):
    """A group manager that hands tasks to workers: an Agent with the workers as sub-agents."""

    component_type: Literal["ManagerWorkers"]
    group_manager: AgenticComponent
    workers: list[AgenticComponent] = Field(min_length=1)


#: What runs a conversation: an Agent or a multi-agent component.
AgenticComponent = Annotated[
    Agent | SpecializedAgent | ManagerWorkers, Field(discriminator="component_type")
]


class Swarm(WithIO):
    """Agents that message each other and hand the user's conversation over (a root only).

    Each pair of ``relationships`` lets the first agent (the caller) reach the second (the
    recipient); ``handoff`` says how: ``never`` (send a message, get the answer back),
    ``always`` (hand the conversation over), ``optional`` (both; ``true`` in older versions,
    ``false`` meaning ``never``).
    """

    component_type: Literal["Swarm"]
    first_agent: AgenticComponent
    relationships: list[tuple[AgenticComponent, AgenticComponent]] = Field(min_length=1)
    handoff: bool | Literal["never", "optional", "always"] = "optional"


class A2AAgent(WithIO):
    """An agent served elsewhere, asked over the A2A protocol (JSON-RPC ``message/send``)."""

    component_type: Literal["A2AAgent"]
    agent_url: str = Field(min_length=1)


#: What an AgentNode runs: a local agentic component or a remote A2A agent.
NodeAgent = Annotated[
    Agent | SpecializedAgent | ManagerWorkers | A2AAgent, Field(discriminator="component_type")
]


class _Node(WithIO):
    branches: list[str] | None = None


class StartNode(_Node):
    """Where a flow starts; its outputs are the flow's inputs."""

    component_type: Literal["StartNode"]


class EndNode(_Node):
    """Where a flow ends, on ``branch_name``; its inputs are the flow's outputs."""

    component_type: Literal["EndNode"]
    branch_name: str = NEXT


class LlmNode(_Node):
    """One completion from ``prompt_template``."""

    component_type: Literal["LlmNode"]
    llm_config: LlmConfig
    prompt_template: str


class AgentNode(_Node):
    """A turn of an agent."""

    component_type: Literal["AgentNode"]
    agent: NodeAgent

    @pydantic.field_validator("agent", mode="before")
    @classmethod
    def _no_swarm(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("component_type") == "Swarm":
            raise ValueError(
                "a Swarm runs only at the root of a document, where it talks with the user "
                "turn after turn; in an AgentNode use a ManagerWorkers"
            )
        return value

    @pydantic.field_validator("branches")
    @classmethod
    def _no_agent_branches(cls, value: list[str] | None) -> list[str] | None:
        if value and set(value) != {NEXT}:
            raise ValueError(
                "an agent choosing the next branch is not supported; branch on its answer "
                "with a BranchingNode"
            )
        return value


class ToolNode(_Node):
    """One tool call."""

    component_type: Literal["ToolNode"]
    tool: Tool


class BranchingNode(_Node):
    """Chooses the branch that ``mapping`` gives the input value, else ``default``."""

    component_type: Literal["BranchingNode"]
    mapping: dict[str, str]


class FlowNode(_Node):
    """Runs a sub-flow."""

    component_type: Literal["FlowNode"]
    subflow: Flow


class CatchExceptionNode(_Node):
    """Runs a sub-flow; a failure inside it takes branch ``caught_exception_branch``."""

    component_type: Literal["CatchExceptionNode"]
    subflow: Flow


class ParallelFlowNode(_Node):
    """Runs its sub-flows at the same time; its outputs are all of theirs."""

    component_type: Literal["ParallelFlowNode"]
    subflows: list[Flow] = Field(min_length=1)


class MapNode(_Node):
    """Runs a sub-flow per item of its ``iterated_`` inputs; reduces the outputs."""

    component_type: Literal["MapNode", "ParallelMapNode"]
    subflow: Flow
    reducers: dict[str, Literal["append", "sum", "average", "max", "min"]] | None = None


class ApiNode(_Node):
    """An HTTP call."""

    component_type: Literal["ApiNode"]
    url: str = Field(min_length=1)
    http_method: str = Field(min_length=1)
    api_spec_uri: str | None = None
    data: Any = None
    query_params: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, Any] = Field(default_factory=dict)
    sensitive_headers: dict[str, Any] | None = None
    url_allow_list: list[str] | None = None
    retry_policy: RetryPolicy | None = None


class InputMessageNode(_Node):
    """Asks the user for a message."""

    component_type: Literal["InputMessageNode"]
    message: str | None = None


class OutputMessageNode(_Node):
    """Emits ``message`` (with ``{{var}}`` placeholders) to the conversation."""

    component_type: Literal["OutputMessageNode"]
    message: str


Node = Annotated[
    StartNode
    | EndNode
    | LlmNode
    | AgentNode
    | ToolNode
    | BranchingNode
    | FlowNode
    | MapNode
    | ParallelFlowNode
    | CatchExceptionNode
    | ApiNode
    | InputMessageNode
    | OutputMessageNode,
    Field(discriminator="component_type"),
]


class ControlFlowEdge(Component):
    """``to_node`` runs after ``from_node`` leaves on ``from_branch``."""

    component_type: Literal["ControlFlowEdge"]
    from_node: Node
    from_branch: str | None = None
    to_node: Node


class DataFlowEdge(Component):
    """An output of one node is an input of another."""

    component_type: Literal["DataFlowEdge"]
    source_node: Node
    source_output: str
    destination_node: Node
    destination_input: str


class Flow(WithIO):
    """A graph of nodes."""

    component_type: Literal["Flow"]
    start_node: Node
    nodes: list[Node]
    control_flow_connections: list[ControlFlowEdge]
    data_flow_connections: list[DataFlowEdge] | None = None


Root = Annotated[
    Flow | Agent | SpecializedAgent | ManagerWorkers | Swarm, Field(discriminator="component_type")
]
_ROOT: pydantic.TypeAdapter[Flow | Agent | SpecializedAgent | ManagerWorkers | Swarm] = (
    pydantic.TypeAdapter(Root)
)
_ANY = Annotated[
    Flow
    | Agent
    | SpecializedAgent
    | ManagerWorkers
    | Swarm
    | A2AAgent
    | AgentSpecializationParameters
    | ControlFlowEdge
    | DataFlowEdge
    | Node
    | Tool
    | McpToolBox
    | McpToolSpec
    | Transport
    | LlmConfig,
    Field(discriminator="component_type"),
]
_COMPONENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(_ANY)
_ROOTS = ("Flow", "Agent", "SpecializedAgent", "ManagerWorkers", "Swarm")


def _problems(exc: pydantic.ValidationError, prefix: str) -> list[documents.Problem]:
    """Field problems at their document path, without pydantic's component-type tags."""
    out = []
    for problem in documents.validation_problems(exc):
        tail = ".".join(p for p in problem.path.split(".") if p not in _TYPES)
        path = f"{prefix}.{tail}" if prefix and tail else prefix or tail
        out.append(documents.Problem(path, problem.message))
    return out


def parse(
    resolved: document.Resolved,
) -> Flow | Agent | SpecializedAgent | ManagerWorkers | Swarm:
    """Type a resolved document; SpecInvalid with every field problem at its path.

    Each referenced component is checked once, at its place under ``$referenced_components``,
    so a mistake in a node used by five edges is reported once.
    """
    root = resolved.root
    if root.get("component_type") not in _ROOTS:
        raise errors.SpecInvalid(
            [
                errors.problem(
                    "component_type",
                    f"the document's root is a {root.get('component_type')}; "
                    "agentflows runs a Flow, an Agent, a SpecializedAgent, a ManagerWorkers "
                    "or a Swarm",
                )
            ]
        )
    found: list[documents.Problem] = []
    for path, component in resolved.references.items():
        try:
            _COMPONENT.validate_python(component)
        except pydantic.ValidationError as exc:
            found += _problems(exc, path)
    if found:
        raise errors.SpecInvalid(found)
    try:
        return _ROOT.validate_python(root)
    except pydantic.ValidationError as exc:
        raise errors.SpecInvalid(_problems(exc, "")) from None
