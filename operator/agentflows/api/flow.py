"""The Flow resource: a graph of nodes with edges, an output expression, triggers and limits.

Nodes are agents, model calls, tools, transforms, branches, fan-outs, human gates, sub-flows.

Expressions: a string starting with ``=`` is a jq program over the scope
``{run, nodes, item, items}``; ``{{ jq }}`` inside any other string interpolates. The engine
compiles every expression when it validates a Flow.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.api import runner as runner_api

MAX_NODES = 200
#: Longest deadline or timeout in seconds (one year), for runs and human requests alike.
MAX_TIMEOUT_SECONDS = 31_536_000
#: Every key that selects what a node does; a node sets exactly one.
NODE_KINDS = ("agent", "llm", "tool", "transform", "branch", "map", "approval", "input", "flow")


#: Longest list of nodeTools on one agent call.
MAX_NODE_TOOLS = 32
#: A field the agent fills: a name a function parameter can have.
FIELD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class NodeTool(common.ApiModel):
    """Another node of the Flow offered to the agent as a tool (it then never runs on its own).

    The tool's parameters are ``fields``: with a ``tool`` node, keys of its ``args``; with a
    ``flow`` node, keys of its ``input``; with ``llm`` and ``agent`` nodes, ``prompt`` (and an
    llm's ``system``). Every node sees the agent's arguments as ``.args`` in its expressions.
    """

    node: common.Identifier = Field(description="Id of the node to offer.")
    fields: list[Annotated[str, Field(pattern=FIELD_PATTERN)]] = Field(
        default_factory=list,
        max_length=64,
        description="Fields the agent fills; every other field stays as configured.",
    )
    description: str = Field(
        default="",
        max_length=4096,
        description="What the model is told the tool does (default: the node's description).",
    )


class AgentTools(common.ApiModel):
    """The tools an agent node's turn is offered."""

    skip: bool = Field(
        default=False,
        description="Offer no tools at all (the Agent's tools, skills, sub-agents, sub-flows, "
        "human review): one plain completion with the conversation.",
    )


class AgentAnswer(common.ApiModel):
    """The answer an agent turn must give: values it submits with the ``submit_result`` tool.

    Agent Spec's answer contract for an Agent that declares outputs: the turn ends only when
    the model calls ``submit_result`` with arguments matching ``schema`` (a call that does not
    match is an error result and the model goes on). A text reply is not the answer: with
    ``askUser`` it is a message to the user, and the node waits for the user's reply (an
    ``input`` request) and goes on with it; without, the model is told the user is not there
    and asked again.
    """

    schema_: common.JsonValue = Field(
        alias="schema",
        description="JSON Schema (type object) of the values submitted; they are the node's "
        "json output (a property's default fills a value the model leaves out).",
    )
    ask_user: bool = Field(
        default=True,
        description="A text reply waits for the user's answer (Agent Spec human_in_the_loop); "
        "false: the model is reminded to submit and called again (bounded by the Agent's "
        "maxToolIterations).",
    )


class AgentCall(common.ApiModel):
    """Run an Agent's turn with a prompt."""

    name: common.ObjectName = Field(description="Name of the Agent in the Flow's namespace.")
    prompt: str = Field(max_length=200_000, description="User prompt (expressions allowed).")
    node_tools: list[NodeTool] = Field(
        default_factory=list,
        max_length=MAX_NODE_TOOLS,
        description="Other nodes of the Flow the agent may call as tools.",
    )
    files: list[agent_api.ReferenceFile] = Field(
        default_factory=list,
        max_length=agent_api.MAX_FILES,
        description="Reference files added to the Agent's own before the conversation.",
    )
    session: str | None = Field(
        default=None,
        max_length=4096,
        description="Expression naming the conversation to continue across runs (e.g. "
        '"={{ .run.input.ticket }}"); overrides the Agent\'s.',
    )
    request: str | None = Field(
        default=None,
        max_length=4096,
        description="Expression separating parallel calls within one session (e.g. "
        '"={{ .item.id }}"); overrides the Agent\'s.',
    )
    memory: agent_api.Memory | None = Field(
        default=None, description="Memory settings for this node; overrides the Agent's."
    )
    tools: AgentTools | None = Field(default=None, description="Which tools the turn is offered.")
    history: str | None = Field(
        default=None,
        max_length=200_000,
        description="Expression giving turns [{role, content}] sent after the Agent's history "
        "and before the prompt (e.g. an imported Agent Spec flow's conversation so far: its "
        "messages and the user's answers).",
    )
    answer: AgentAnswer | None = Field(
        default=None,
        description="Values the agent must submit to finish (submit_result tool); without, its "
        "last text reply is the answer.",
    )


class LlmCall(common.ApiModel):
    """One model completion, optionally parsed as JSON against a schema."""

    model: agent_api.ModelSpec = Field(description="The model to call.")
    system: str = Field(default="", max_length=200_000, description="System prompt.")
    prompt: str = Field(max_length=200_000, description="User prompt (expressions allowed).")
    output_schema: common.JsonValue = Field(
        default=None, description="JSON Schema the reply must match; the reply is parsed as JSON."
    )


class ToolCall(common.ApiModel):
    """Call one tool: a tool of an Agent (agent + name) or an inline http/python/client/mcp tool."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.agent), has(self.http), has(self.python), has(self.client),"
                    " has(self.mcp)].filter(x, x).size() == 1",
                    "message": "set exactly one of agent (with name), http, python, client or mcp "
                    "(with name)",
                }
            ]
        }
    }

    agent: common.ObjectName | None = Field(
        default=None, description="Agent whose tool to call (with name)."
    )
    name: str | None = Field(
        default=None,
        max_length=128,
        description="Tool name (with agent or mcp: the tool to call); a client tool's name.",
    )
    http: agent_api.HttpTool | None = Field(default=None, description="An inline HTTP tool.")
    python: agent_api.PythonTool | None = Field(default=None, description="An inline Python tool.")
    client: agent_api.ClientTool | None = Field(
        default=None, description="A tool the caller runs: the node waits for its result."
    )
    mcp: agent_api.McpTool | None = Field(
        default=None, description="An inline MCP server; name is the server's tool to call."
    )
    args: common.JsonValue = Field(
        default=None, description="Arguments (expressions allowed inside)."
    )

    @model_validator(mode="after")
    def _one_target(self) -> ToolCall:
        kinds = ("agent", "http", "python", "client", "mcp")
        targets = [k for k in kinds if getattr(self, k) is not None]
        if len(targets) != 1:
            raise ValueError(
                "set exactly one of agent (with name), http, python, client or mcp (with name)"
            )
        if (self.agent is not None or self.mcp is not None) and not self.name:
            raise ValueError(
                f"a tool of {'an agent' if self.agent else 'an MCP server'} needs name"
            )
        return self


class FlowCall(common.ApiModel):
    """Run another Flow inside this run; its nodes appear in status under a prefix."""

    name: common.ObjectName = Field(description="Name of the Flow in the same namespace.")
    input: common.JsonValue = Field(default=None, description="Input of the sub-flow.")
    catch_errors: bool = Field(
        default=False,
        description="A failed node inside the sub-flow does not fail this node: it succeeds "
        "with {caughtError: message} (limits and timeouts still stop the run).",
    )


class Branch(common.ApiModel):
    """Choose one successor by the value of an expression.

    The expression is ``value``, not ``on`` as first designed: kubectl's YAML reader turns an
    unquoted ``on:`` key into ``true``, so a Flow applied with kubectl would lose it.
    """

    value: str = Field(
        max_length=4096, description="Expression whose value (as a string) selects a case."
    )
    cases: dict[str, common.Identifier] = Field(
        default_factory=dict, description="Value (as a string) -> id of the node to run."
    )
    default: common.Identifier | None = Field(
        default=None, description="Node to run when no case matches; none ends the path."
    )


class MapNode(common.ApiModel):
    """Fan out over a list, running an agent, tool or flow per item; results in item order."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.agent), has(self.tool), has(self.flow)]"
                    ".filter(x, x).size() == 1",
                    "message": "set exactly one of agent, tool or flow",
                }
            ]
        }
    }

    items: str = Field(max_length=4096, description="Expression giving the list to map over.")
    concurrency: int = Field(default=4, ge=1, le=256, description="Items run at once.")
    max_items: int = Field(default=1000, ge=1, le=10_000, description="Largest list accepted.")
    agent: AgentCall | None = Field(default=None, description="Run an agent per item.")
    tool: ToolCall | None = Field(default=None, description="Call a tool per item.")
    flow: FlowCall | None = Field(default=None, description="Run a sub-flow per item.")

    @model_validator(mode="after")
    def _one_body(self) -> MapNode:
        bodies = [k for k in ("agent", "tool", "flow") if getattr(self, k) is not None]
        if len(bodies) != 1:
            raise ValueError("set exactly one of agent, tool or flow")
        return self


class OnTimeout(enum.StrEnum):
    """What an expired human request does."""

    #: The request is decided ``reject`` and the run goes on (branches see it).
    REJECT = "reject"
    #: The run fails with reason RequestExpired.
    FAIL = "fail"


class Approval(common.ApiModel):
    """A human gate: the run waits until an approver approves or rejects."""

    message: str = Field(max_length=8192, description="What the approver is asked.")
    summary: str = Field(
        default="", max_length=16384, description="Context shown with the request."
    )
    approvers: common.Approvers = Field(
        default_factory=common.Approvers, description="Who may decide."
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="Expire the request after this long.",
    )
    on_timeout: OnTimeout = Field(default=OnTimeout.REJECT, description="reject or fail.")


class InputRequest(common.ApiModel):
    """Ask a human for data matching a JSON Schema."""

    message: str = Field(max_length=8192, description="What the human is asked.")
    schema_: common.JsonValue = Field(
        default=None, alias="schema", description="JSON Schema the answer must match."
    )
    approvers: common.Approvers = Field(
        default_factory=common.Approvers, description="Who may answer."
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="Expire the request after this long.",
    )
    on_timeout: OnTimeout = Field(default=OnTimeout.FAIL, description="reject or fail.")


class RetryOn(enum.StrEnum):
    """A kind of temporary failure a node retry policy may retry."""

    #: A model call answered 408, 409, 425, 429 or 5xx, timed out, lost its connection or gave
    #: a reply that does not match the node's output schema.
    MODEL = "Model"
    #: A tool (python or MCP) failed in a way it marks temporary: a timeout, an unreachable server.
    TOOL = "Tool"
    #: An http tool's endpoint answered 408, 425, 429 or 5xx, timed out or could not be reached.
    HTTP = "Http"


class NodeRetry(common.ApiModel):
    """How a node is tried again after a temporary failure (a lost pod is spec.retry's).

    A retried agent node starts its turn again: tools it called before the failure run again.
    """

    max_attempts: int = Field(
        default=1,
        ge=1,
        le=10,
        description="Attempts in total, the first included; 1 never retries.",
    )
    backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        le=300,
        description="Delay before the second attempt; it doubles for each later one.",
    )
    max_backoff_seconds: float = Field(
        default=30.0, ge=0, le=3600, description="Upper bound of one delay, before jitter."
    )
    jitter: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Random share of a delay: 0.5 waits between 50% and 100% of it.",
    )
    retry_on: list[RetryOn] = Field(
        default_factory=lambda: list(RetryOn),
        max_length=len(RetryOn),
        description="Which temporary failures are retried: Model, Tool, Http (default: all). "
        "Permanent failures (a bad request, a missing secret, a rejected approval) never are.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


#: How many times a loop runs unless its re-entry node or spec.limits says otherwise.
DEFAULT_LOOP_ITERATIONS = 10
#: The most iterations a loop may be allowed.
MAX_LOOP_ITERATIONS = 10_000


class Node(common.ApiModel):
    """One step of the flow: an id plus exactly one kind."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[" + ", ".join(f"has(self.{k})" for k in NODE_KINDS) + "]"
                    ".filter(x, x).size() == 1",
                    "message": "set exactly one of " + ", ".join(NODE_KINDS),
                }
            ]
        }
    }

    id: common.Identifier = Field(description="Unique id; outputs are at .nodes.<id>.")
    description: str = Field(default="", max_length=4096, description="What the node is for.")
    agent: AgentCall | None = Field(default=None, description="Run an Agent.")
    llm: LlmCall | None = Field(default=None, description="One model completion.")
    tool: ToolCall | None = Field(default=None, description="Call one tool.")
    transform: str | None = Field(
        default=None, max_length=65_536, description="A jq expression computing the output."
    )
    branch: Branch | None = Field(default=None, description="Choose a successor.")
    map: MapNode | None = Field(default=None, description="Fan out over a list.")
    approval: Approval | None = Field(default=None, description="Wait for a human decision.")
    input: InputRequest | None = Field(default=None, description="Wait for human input.")
    flow: FlowCall | None = Field(default=None, description="Run a sub-flow.")
    retry: NodeRetry | None = Field(
        default=None,
        description="Retry this node after a temporary failure (default: spec.nodeRetry).",
    )
    max_iterations: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LOOP_ITERATIONS,
        description="On the node a loop re-enters: how many times the loop may run "
        "(default: spec.limits.maxIterations).",
    )

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Node:
        kinds = [k for k in NODE_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"set exactly one of {', '.join(NODE_KINDS)} (got {', '.join(kinds) or 'none'})"
            )
        return self

    @property
    def kind(self) -> str:
        """Which of NODE_KINDS this node is."""
        return next(k for k in NODE_KINDS if getattr(self, k) is not None)


class Edge(common.ApiModel):
    """A dependency: ``to`` runs after ``from``; ``branch`` names the case that takes it."""

    from_: common.Identifier = Field(alias="from", description="Node that runs first.")
    to: common.Identifier = Field(description="Node that runs after it.")
    branch: str | None = Field(
        default=None,
        max_length=256,
        description="For an edge out of a branch node: the case value (or 'default').",
    )


class Schedule(common.ApiModel):
    """Start runs on a cron schedule (a CronJob owned by the Flow)."""

    cron: str = Field(min_length=1, max_length=256, description="Cron expression.")
    time_zone: str | None = Field(default=None, max_length=64, description="IANA time zone.")
    starting_deadline_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TIMEOUT_SECONDS,
        description="Skip a run that could not start within this many seconds.",
    )
    suspend: bool = Field(default=False, description="Pause the schedule.")


class Webhook(common.ApiModel):
    """Start runs from HMAC-SHA256-signed POSTs to the webhook receiver."""

    secret: common.SecretKeySelector = Field(description="Secret holding the HMAC key.")


EventType = Literal["ADDED", "MODIFIED", "DELETED"]
#: A kubernetes trigger's ``namespace`` for every namespace.
ALL_NAMESPACES = "*"


def _default_event_types() -> list[EventType]:
    return ["ADDED", "MODIFIED"]


class KubernetesSource(common.ApiModel):
    """Start runs when watched Kubernetes objects change or events occur."""

    api_version: str = Field(max_length=256, description="API version, e.g. v1.")
    kind: str = Field(max_length=256, description="Kind, e.g. Event or Pod.")
    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$",
        description="Namespace to watch (default: the Flow's own; '*': every namespace). "
        "Another namespace, or '*', is admitted only if the Flow's writer may list and watch "
        "the kind there (config/policies/trigger-scope.yaml).",
    )
    label_selector: str | None = Field(default=None, max_length=1024, description="Labels.")
    field_selector: str | None = Field(default=None, max_length=1024, description="Fields.")
    event_types: list[EventType] = Field(
        default_factory=_default_event_types, description="Watch event types."
    )
    filter: str | None = Field(
        default=None, max_length=4096, description="jq expression; a truthy value starts a run."
    )
    dedup_window_seconds: int = Field(
        default=600, ge=0, le=86400, description="Drop repeats of the same object and reason."
    )

    def watched_namespace(self, own: str) -> str | None:
        """The namespace watched for a Flow in ``own``: its own unless named; None for all."""
        if self.namespace == ALL_NAMESPACES:
            return None
        return self.namespace or own


class Trigger(common.ApiModel):
    """Starts runs by itself: one of schedule, webhook or kubernetes."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.schedule), has(self.webhook), has(self.kubernetes)]"
                    ".filter(x, x).size() == 1",
                    "message": "set exactly one of schedule, webhook or kubernetes",
                }
            ]
        }
    }

    name: common.Identifier = Field(description="Trigger name, unique in the Flow.")
    schedule: Schedule | None = Field(default=None, description="A cron schedule.")
    webhook: Webhook | None = Field(default=None, description="A signed webhook.")
    kubernetes: KubernetesSource | None = Field(default=None, description="Kubernetes changes.")
    input: common.JsonValue = Field(
        default=None, description="Run input; expressions see run.trigger."
    )
    rate_limit_per_minute: int = Field(
        default=60, ge=1, le=100_000, description="Most runs this trigger starts per minute."
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Trigger:
        kinds = [k for k in ("schedule", "webhook", "kubernetes") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("set exactly one of schedule, webhook or kubernetes")
        return self


class ConcurrencyPolicy(enum.StrEnum):
    """What happens to a new run while others of the Flow are active."""

    #: Start it.
    ALLOW = "Allow"
    #: Skip it (it ends Cancelled with reason ConcurrencyForbid).
    FORBID = "Forbid"
    #: Cancel the active runs, then start it.
    REPLACE = "Replace"
    #: Queue it until a slot frees.
    QUEUE = "Queue"


class Concurrency(common.ApiModel):
    """How many runs of the Flow may be active at once, and what happens to the next one."""

    policy: ConcurrencyPolicy = Field(default=ConcurrencyPolicy.ALLOW, description="The policy.")
    max: int = Field(default=1, ge=1, le=10_000, description="Active runs allowed by the policy.")


class Limits(common.ApiModel):
    """Limits that end a run with a clear error."""

    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="Run deadline, counted while the run waits too.",
    )
    max_node_executions: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Node executions (map items count)."
    )
    max_iterations: int = Field(
        default=DEFAULT_LOOP_ITERATIONS,
        ge=1,
        le=MAX_LOOP_ITERATIONS,
        description="Iterations of each loop, unless its re-entry node sets maxIterations.",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000_000_000, description="Tokens over the whole run."
    )
    max_cost_usd: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        alias="maxCostUSD",
        description="Model cost over the whole run, USD.",
    )


class Autonomy(enum.StrEnum):
    """What agents may do without a human."""

    #: Only tools marked readOnly run.
    READONLY = "readonly"
    #: Tools not marked readOnly become approval requests.
    SUPERVISED = "supervised"
    #: Every tool runs.
    FULL = "full"


class Retry(common.ApiModel):
    """How often a failed or lost runner pod is replaced; each attempt resumes."""

    max_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description=(
            "Runner attempts per run: the first one and one after each lost attempt "
            "(status.attemptsLost); attempts started by a human's decision do not count."
        ),
    )
    backoff_seconds: float = Field(
        default=5,
        ge=0,
        le=3600,
        description="Delay before the attempt after a lost one (doubles per lost attempt).",
    )


class FlowSpec(common.ApiModel):
    """Desired state of a Flow."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.nodes.all(n, self.nodes.exists_one(m, m.id == n.id))",
                    "message": "node ids must be unique",
                },
                {
                    "rule": "!has(self.triggers) || self.triggers.all(t, "
                    "self.triggers.exists_one(u, u.name == t.name))",
                    "message": "trigger names must be unique",
                },
            ]
        }
    }

    description: str = Field(default="", max_length=8192, description="What the flow does.")
    input: common.JsonValue = Field(default=None, description="JSON Schema of the run input.")
    nodes: list[Node] = Field(
        min_length=1, max_length=MAX_NODES, description="The steps of the flow."
    )
    edges: list[Edge] = Field(
        default_factory=list,
        max_length=1000,
        description="Dependencies; when omitted, nodes run in list order.",
    )
    output: str | None = Field(
        default=None, max_length=65_536, description="Expression for the run output."
    )
    triggers: list[Trigger] = Field(
        default_factory=list, max_length=32, description="Sources that start runs."
    )
    concurrency: Concurrency = Field(default_factory=Concurrency, description="Concurrency policy.")
    limits: Limits = Field(default_factory=Limits, description="Run limits.")
    autonomy: Autonomy = Field(default=Autonomy.FULL, description="readonly, supervised or full.")
    runner: runner_api.RunnerSpec = Field(
        default_factory=runner_api.RunnerSpec, description="Runner pod overrides."
    )
    retry: Retry = Field(default_factory=Retry, description="Runner retries.")
    node_retry: NodeRetry = Field(
        default_factory=NodeRetry,
        description="Default retry of every node after a temporary failure; nodes[].retry "
        "replaces it for one node (default: no retry).",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=2_147_483_647, description="Delete finished runs after this long."
    )
    successful_runs_history_limit: int = Field(
        default=10, ge=0, le=10_000, description="Succeeded runs kept."
    )
    failed_runs_history_limit: int = Field(
        default=10, ge=0, le=10_000, description="Failed and cancelled runs kept."
    )


class FlowStatus(common.ApiModel):
    """Observed state of a Flow, written by the operator."""

    observed_generation: int | None = Field(
        default=None, description="Generation the status was computed from."
    )
    conditions: list[common.Condition] = Field(
        default_factory=list,
        description="Ready: the flow validates; its message lists the problems.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    last_run: str | None = Field(default=None, description="Name of the newest run.")
    active_runs: int = Field(default=0, ge=0, description="Runs not yet finished.")


class Flow(common.ApiModel):
    """A workflow of agents, model calls, tools and human gates."""

    api_version: Literal["agentflows.io/v1alpha1"] = Field(
        default="agentflows.io/v1alpha1", description="agentflows.io/v1alpha1"
    )
    kind: Literal["Flow"] = Field(default="Flow", description="Flow")
    metadata: common.ObjectMeta = Field(
        default_factory=common.ObjectMeta, description="Object metadata."
    )
    spec: FlowSpec = Field(description="Desired state.")
    status: FlowStatus | None = Field(default=None, description="Observed state.")
