"""The Agent resource: a model wired to a system prompt, tools, skills and sub-agents.

An Agent is referenced by name from Flow nodes (``agent``, ``map``). Tools are a volume-style
union: each entry has a ``name`` and exactly one of ``mcp``, ``http`` or ``python``.
"""

from __future__ import annotations

import enum
import posixpath
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agentflows.api import common

MAX_TOOLS = 64
#: What a model's ``apiBase`` may be: http or https, a host (no space, no empty host), a path.
#: The same rule is in the CRD (``pattern``) and in :class:`ModelSpec`'s validator.
API_BASE_PATTERN = r"^https?://([^/?#@\s]+@)?[^/?#@\s]+(/\S*)?$"


class ModelSpec(common.ApiModel):
    """Which model to call and how; any litellm model string works."""

    name: str = Field(
        min_length=1,
        max_length=256,
        description="litellm model string, e.g. openai/gpt-4o-mini or anthropic/claude-sonnet-4.",
    )
    api_base: str | None = Field(
        default=None,
        max_length=2048,
        description=(
            "Base URL of the model's endpoint (vLLM, Ollama, a proxy): http:// or https:// "
            "with a host, e.g. http://127.0.0.1:11434/v1."
        ),
        json_schema_extra={"pattern": API_BASE_PATTERN},
    )
    api_key: common.SecretKeyRef | None = Field(
        default=None, description="Secret holding the API key; injected as env, never read here."
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling temperature.")
    top_p: float | None = Field(default=None, ge=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Maximum completion tokens per call."
    )
    context_window: int | None = Field(
        default=None,
        ge=256,
        le=10_000_000,
        description="Context window in tokens; defaults to litellm's table, else 128000.",
    )
    timeout_seconds: float = Field(
        default=120, gt=0, le=3600, description="Timeout of one model call, in seconds."
    )
    retries: int = Field(default=2, ge=0, le=10, description="Retries of a failed model call.")

    @field_validator("api_base")
    @classmethod
    def _api_base_is_http(cls, value: str | None) -> str | None:
        if value is not None and not re.match(API_BASE_PATTERN, value):
            raise ValueError(
                f"{value[:100]!r} is not a model endpoint: use http:// or https:// followed by "
                "a host, e.g. http://127.0.0.1:11434/v1 or https://llm.internal:8443"
            )
        return value


class HistoryTurn(common.ApiModel):
    """One scripted turn sent before the prompt (few-shot examples, fixed context)."""

    role: Literal["user", "assistant", "system"] = Field(description="Speaker of the turn.")
    content: str = Field(max_length=100_000, description="Text of the turn.")


class McpTool(common.ApiModel):
    """An MCP server whose tools the agent may call: streamable HTTP (url) or stdio (command)."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.url) != has(self.command)",
                    "message": "set exactly one of url (streamable HTTP) or command (stdio)",
                },
                {
                    "rule": "!has(self.sse) || !self.sse || has(self.url)",
                    "message": "sse needs url",
                },
                {
                    "rule": "!has(self.env) || self.env.all(k, "
                    + common.OPERATOR_ENV_CEL.format(name="k")
                    + ")",
                    "message": common.operator_env_message("env"),
                },
            ]
        }
    }

    url: str | None = Field(
        default=None, max_length=2048, description="Streamable HTTP endpoint of the server."
    )
    sse: bool = Field(
        default=False,
        description="The url speaks the older HTTP+SSE transport, not streamable HTTP.",
    )
    headers: dict[str, common.SecretKeyRef] = Field(
        default_factory=dict, description="HTTP headers whose values come from Secrets."
    )
    command: common.OsText | None = Field(
        default=None, max_length=1024, description="Command that starts a stdio server in the pod."
    )
    args: list[common.OsText] = Field(
        default_factory=list, description="Arguments of the stdio command."
    )
    env: dict[common.OsText, common.OsText] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra environment of the stdio server (no name starting with "
        f"{common.OPERATOR_ENV_PREFIX}).",
    )
    include: list[str] = Field(
        default_factory=list, description="Only these server tools are offered (empty: all)."
    )
    exclude: list[str] = Field(default_factory=list, description="Server tools never offered.")
    prefix_names: bool = Field(
        default=True,
        description="Offer each server tool as <tool name>_<server tool name> (false: under "
        "the server tool's own name; two tools of one name then fail the turn).",
    )
    timeout_seconds: float = Field(
        default=60, gt=0, le=3600, description="Timeout of one tool call, in seconds."
    )

    @field_validator("env")
    @classmethod
    def _not_the_operators(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            problem = common.operator_env_problem(name)
            if problem:
                raise ValueError(problem)
        return env

    @model_validator(mode="after")
    def _one_transport(self) -> McpTool:
        if (self.url is None) == (self.command is None):
            raise ValueError("set exactly one of url (streamable HTTP) or command (stdio)")
        if self.sse and self.url is None:
            raise ValueError("sse needs url")
        return self


class HttpTool(common.ApiModel):
    """An HTTP endpoint called with the model's arguments."""

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(
        default="GET", description="HTTP method."
    )
    url: str = Field(
        min_length=1,
        max_length=2048,
        description="URL template; {{ .args.x }} interpolates the model's arguments.",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Plain request headers.")
    secret_headers: dict[str, common.SecretKeyRef] = Field(
        default_factory=dict, description="Request headers whose values come from Secrets."
    )
    body: common.JsonValue = Field(
        default=None, description="Request body template (JSON); defaults to the arguments."
    )
    allow_hosts: list[str] = Field(
        default_factory=list,
        description=(
            "Host names the URL may have after templating (empty: the URL's own host; *.domain"
            " matches subdomains). Private and loopback addresses are reached only through a"
            " host named exactly here; link-local and cloud-metadata addresses never."
        ),
    )
    timeout_seconds: float = Field(default=30, gt=0, le=600, description="Request timeout.")
    max_response_bytes: int = Field(
        default=1_048_576, ge=1, le=16_777_216, description="Largest response body accepted."
    )


class PythonTool(common.ApiModel):
    """A Python script run in a subprocess: JSON arguments on stdin, a JSON result on stdout."""

    script: str = Field(min_length=1, max_length=262_144, description="Python source to run.")
    timeout_seconds: float = Field(default=30, gt=0, le=3600, description="Run timeout.")


class ClientTool(common.ApiModel):
    """A tool the caller runs: each call waits, as a ``kind: tool`` request, for its result.

    The caller answers with decision ``respond`` and the result as ``data`` (``reject`` tells
    the model the call was refused). Open Agent Spec's ClientTool maps here.
    """

    confirm: bool = Field(
        default=False,
        description="A human confirms each call (an approval request) before the caller is "
        "asked to run it; a rejected call is not requested and the model is told.",
    )


class Tool(common.ApiModel):
    """A tool the model may call; exactly one of mcp, http, python or client."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.mcp), has(self.http), has(self.python), has(self.client)]"
                    ".filter(x, x).size() == 1",
                    "message": "set exactly one of mcp, http, python or client",
                }
            ]
        }
    }

    name: common.Identifier = Field(description="Tool name the model sees (mcp: a prefix).")
    description: str = Field(
        default="", max_length=4096, description="What the tool does, for the model."
    )
    parameters: common.JsonValue = Field(
        default=None, description="JSON Schema of the arguments (http, python and client tools)."
    )
    read_only: bool = Field(
        default=False, description="The tool changes nothing; allowed under autonomy readonly."
    )
    mcp: McpTool | None = Field(default=None, description="Tools of an MCP server.")
    http: HttpTool | None = Field(default=None, description="An HTTP endpoint.")
    python: PythonTool | None = Field(default=None, description="A Python script.")
    client: ClientTool | None = Field(
        default=None, description="Run by the caller: each call waits for its result."
    )

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Tool:
        kinds = [k for k in TOOL_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"set exactly one of mcp, http, python or client (got {', '.join(kinds) or 'none'})"
            )
        return self

    @property
    def kind(self) -> str:
        """Which of mcp, http, python or client this tool is."""
        return next(k for k in TOOL_KINDS if getattr(self, k) is not None)


#: The kinds of Tool, one field each.
TOOL_KINDS = ("mcp", "http", "python", "client")


class Skill(common.ApiModel):
    """Instructions prepended to the system prompt, optionally with a script tool."""

    name: common.Identifier = Field(description="Skill name; its script is tool skill_<name>.")
    content: str = Field(max_length=100_000, description="Text prepended to the system prompt.")
    script: str | None = Field(
        default=None,
        max_length=262_144,
        description="Python script exposed as tool skill_<name> (JSON stdin, JSON stdout).",
    )
    parameters: common.JsonValue = Field(
        default=None, description="JSON Schema of the script's arguments."
    )
    timeout_seconds: float = Field(default=30, gt=0, le=3600, description="Script timeout.")


class HumanReview(common.ApiModel):
    """Lets the agent ask a human to review an action before taking it."""

    enabled: bool = Field(default=True, description="Offer the request_human_review tool.")
    guidelines: str = Field(
        default="", max_length=8192, description="When the agent should ask for review."
    )
    approvers: common.Approvers = Field(
        default_factory=common.Approvers, description="Who may decide review requests."
    )


class ContextCompression(common.ApiModel):
    """Summarise the middle of a long conversation before it overflows the context window."""

    enabled: bool = Field(default=True, description="Compress when over the threshold.")
    threshold_ratio: float = Field(
        default=0.8, gt=0, le=1, description="Fraction of the context window that triggers it."
    )


#: Reference files one Agent (or agent node) may attach.
MAX_FILES = 32
#: Largest reference file accepted by default, in bytes (``maxBytes`` raises it per file).
DEFAULT_FILE_MAX_BYTES = 1_048_576
#: Largest ``maxBytes`` a reference file may set.
FILE_MAX_BYTES_LIMIT = 16_777_216


class ConfigMapKeySelector(common.ApiModel):
    """One key of a ConfigMap in the resource's namespace (``data`` or ``binaryData``)."""

    name: common.ObjectName = Field(description="Name of the ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="Key within the ConfigMap.")


class ReferenceFile(common.ApiModel):
    """A file put before the conversation: text into the context, images and PDFs as attachments.

    Exactly one source: a ConfigMap key, a Secret key, a path, or an http(s) URL. A path is
    read in the runner pod (a mounted volume) or, locally, relative to the Flow's file, and may
    not leave that directory. A URL goes through the http tool's guard (``allowHosts``).
    """

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.configMapKeyRef), has(self.secretKeyRef), has(self.path),"
                    " has(self.url)].filter(x, x).size() == 1",
                    "message": "set exactly one of configMapKeyRef, secretKeyRef, path or url",
                }
            ]
        }
    }

    name: str = Field(
        default="",
        max_length=253,
        description="Name the model sees (default: the key, the path's or the URL's file name).",
    )
    config_map_key_ref: ConfigMapKeySelector | None = Field(
        default=None, description="A ConfigMap key (read by the runner in the run's namespace)."
    )
    secret_key_ref: common.SecretKeySelector | None = Field(
        default=None, description="A Secret key (injected into the runner pod like other secrets)."
    )
    path: common.OsText | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A file in a volume mounted in the runner; locally, relative to the Flow file.",
    )
    url: str | None = Field(
        default=None, min_length=1, max_length=2048, description="An http(s) URL to fetch."
    )
    allow_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts the URL may reach, as for an http tool (empty: the URL's own host).",
    )
    content_type: str = Field(
        default="",
        max_length=256,
        description="Media type (default: from the name's extension, else text/plain).",
    )
    max_bytes: int = Field(
        default=DEFAULT_FILE_MAX_BYTES,
        ge=1,
        le=FILE_MAX_BYTES_LIMIT,
        description="Largest size accepted for this file.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ReferenceFile:
        sources = ("config_map_key_ref", "secret_key_ref", "path", "url")
        if sum(getattr(self, s) is not None for s in sources) != 1:
            raise ValueError("set exactly one of configMapKeyRef, secretKeyRef, path or url")
        if self.path is not None and (
            self.path.startswith("/") or posixpath.normpath(self.path).split("/")[0] == ".."
        ):
            raise ValueError(
                f"path {self.path!r} must be relative to the files root and stay inside it "
                "(no leading / and no .. out of it)"
            )
        if self.url is not None and not self.url.lower().startswith(("http://", "https://")):
            raise ValueError(f"url {self.url[:100]!r} must start with http:// or https://")
        return self


class MemoryAccess(enum.StrEnum):
    """What a turn may do with the conversation it continues."""

    #: Load the conversation before the turn and save it after.
    READ_WRITE = "ReadWrite"
    #: Load it, never save: the stored conversation stays as it was.
    READ_ONLY = "ReadOnly"


class Memory(common.ApiModel):
    """Where a turn's conversation persists when a ``session`` is set (agents/sessions.py)."""

    skip: bool = Field(
        default=False,
        description="Stateless one-time agent: nothing is loaded or stored, whatever the session.",
    )
    shared: common.ObjectName | None = Field(
        default=None,
        description="Use the memory called so (another Agent's name, or any shared name) instead "
        "of this Agent's own.",
    )
    access: MemoryAccess = Field(
        default=MemoryAccess.READ_WRITE,
        description="ReadWrite saves the conversation after the turn; ReadOnly only loads it.",
    )


class AgentMemory(Memory):
    """An Agent's memory settings: those of a node, plus bounds on what is kept."""

    max_sessions: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Sessions kept per memory; the least recently written go first.",
    )
    max_age_seconds: int = Field(
        default=30 * 86400,
        ge=60,
        le=common.INT_MAX,
        description="Sessions not written for this long are deleted (locally on the next write; "
        "on a cluster when a run of the memory ends).",
    )
    max_bytes: int = Field(
        default=256 * 1024,
        ge=8192,
        le=1024 * 1024,
        description="Bound of one stored session (JSON bytes); a conversation over it is "
        "compacted through context compression.",
    )


class AgentSpec(common.ApiModel):
    """Desired state of an Agent."""

    model: ModelSpec = Field(description="The model the agent calls.")
    system_prompt: str = Field(default="", max_length=200_000, description="System prompt.")
    history: list[HistoryTurn] = Field(
        default_factory=list,
        max_length=200,
        description="Scripted turns before the prompt; consecutive same-role turns are merged.",
    )
    tools: list[Tool] = Field(
        default_factory=list, max_length=MAX_TOOLS, description="Tools the model may call."
    )
    skills: list[Skill] = Field(default_factory=list, max_length=32, description="Skills.")
    sub_agents: list[common.ObjectName] = Field(
        default_factory=list,
        max_length=32,
        description="Agents callable through the call_sub_agent tool (depth limit 5).",
    )
    sub_flows: list[common.ObjectName] = Field(
        default_factory=list,
        max_length=32,
        description="Flows callable through the call_sub_flow tool (depth limit 5).",
    )
    handoffs: list[common.ObjectName] = Field(
        default_factory=list,
        max_length=32,
        description="Agents the agent may hand the conversation over to with the "
        "handoff_conversation tool: the named Agent answers in its place, given the dialogue "
        "so far, and may hand over in turn (5 handoffs per turn at most).",
    )
    human_review: HumanReview | None = Field(
        default=None, description="Enables the request_human_review tool."
    )
    files: list[ReferenceFile] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="Reference files put before the conversation (text, images, PDFs).",
    )
    max_tool_iterations: int = Field(
        default=10, ge=1, le=200, description="Model turns with tool calls before giving up."
    )
    context_compression: ContextCompression = Field(
        default_factory=ContextCompression, description="Context compression settings."
    )
    session: str | None = Field(
        default=None,
        max_length=4096,
        description="Expression naming the conversation to continue (e.g. "
        '"={{ .run.input.ticket }}"); a node\'s session overrides it.',
    )
    request: str | None = Field(
        default=None,
        max_length=4096,
        description="Expression separating parallel calls within one session (e.g. "
        '"={{ .item.id }}"); a node\'s request overrides it.',
    )
    memory: AgentMemory = Field(
        default_factory=AgentMemory, description="Persistent memory settings and retention."
    )

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.tools) || self.tools.all(t, self.tools.exists_one(u, "
                    "u.name == t.name))",
                    "message": "tool names must be unique",
                }
            ]
        }
    }

    def agents_called(self) -> list[str]:
        """The Agents this Agent may run: its sub-agents, then its handoff targets."""
        return list(dict.fromkeys([*self.sub_agents, *self.handoffs]))

    @model_validator(mode="after")
    def _unique_tool_names(self) -> AgentSpec:
        seen: set[str] = set()
        for tool in self.tools:
            if tool.name in seen:
                raise ValueError(f"tool names must be unique: {tool.name!r} appears twice")
            seen.add(tool.name)
        return self


class AgentStatus(common.ApiModel):
    """Observed state of an Agent, written by the operator."""

    observed_generation: int | None = Field(
        default=None, description="Generation the status was computed from."
    )
    conditions: list[common.Condition] = Field(
        default_factory=list,
        description="Ready: references resolve and the named Secrets exist.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    tools: list[str] = Field(default_factory=list, description="Tool names the model is offered.")


class Agent(common.ApiModel):
    """An LLM agent: a model, a system prompt and the tools it may call."""

    api_version: Literal["agentflows.io/v1alpha1"] = Field(
        default="agentflows.io/v1alpha1", description="agentflows.io/v1alpha1"
    )
    kind: Literal["Agent"] = Field(default="Agent", description="Agent")
    metadata: common.ObjectMeta = Field(
        default_factory=common.ObjectMeta, description="Object metadata."
    )
    spec: AgentSpec = Field(description="Desired state.")
    status: AgentStatus | None = Field(default=None, description="Observed state.")
