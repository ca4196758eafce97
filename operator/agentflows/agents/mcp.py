"""MCP tools: an Agent's ``mcp`` servers, over streamable HTTP or stdio, through the mcp 2.x SDK.

Two callers:

- :class:`McpToolProvider` — one per ``mcp`` tool of an agent turn (built by
  :mod:`agentflows.agents.host`). It connects when the turn's registry is built, lists the
  server's tools, keeps the session for the whole turn (calls of one model reply share it
  concurrently) and closes it when the turn ends (:meth:`McpToolProvider.aclose`).
- :func:`discover_tools` — for the operator, which records the tool names in the Agent's status.
  It connects with a timeout and raises :class:`McpUnavailable` (a message, never a crash).

Transports: ``url`` is streamable HTTP (with ``sse``, the older HTTP+SSE transport), with
``headers`` from Secrets (values looked up under
:func:`agentflows.agents.secrets.secret_env_name`: in a pod, files of its secrets volume);
``command``/``args``/``env`` start a stdio server inside the runner pod, whose environment is the
SDK's safe default (PATH, HOME, ...) plus ``env`` — never a secret value or provider key — and
which cannot read the secrets volume (:mod:`agentflows.agents.containment`).

A ``url`` goes through the one address guard (:mod:`agentflows.agents.egress`), here and in
the operator's :func:`discover_tools`: it is checked before the SDK starts (for a clear error),
and the SDK's httpx2 client connects only through the guard, to the address it checked. Its host
is written by the Agent's author, so it may be private or loopback (an in-cluster server) when
written literally, but never link-local, cloud metadata, multicast, unspecified or reserved,
whichever form spells it. Redirects are not followed.

A stdio server runs contained (:mod:`agentflows.agents.containment`, with
:data:`STDIO_LIMITS`): resource limits, and its whole process tree killed when it stops.

The model sees each server tool as ``<tool name>_<server tool name>``, or with ``prefixNames:
false`` (what an imported Agent Spec MCPTool or MCPToolBox gets) under its own name (characters
outside ``[A-Za-z0-9_-]`` become ``_``, at most 64), with the server's description and input
schema. Two tools of one name in a turn fail it (:class:`agentflows.agents.tools.ToolRegistry`,
naming both servers).
``include`` keeps only the named server tools, ``exclude`` drops some. A server's own
``readOnlyHint`` is not trusted: a server tool is read-only (for ``autonomy``) only when the
Agent marks the ``mcp`` tool ``readOnly``. Each call is bounded by ``timeoutSeconds``; a call
past it is a ``timeout`` result for the model. A tool error (``isError``) is an error result.

The SDK (and its httpx2) is imported only when an agent has an ``mcp`` tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

from agentflows.agents import containment, egress, secrets, tools
from agentflows.api import agent as agent_api
from agentflows.api import errors
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities

#: Longest function name the OpenAI API accepts.
MAX_TOOL_NAME = 64
#: Default time to connect to a server and list its tools, in seconds.
CONNECT_TIMEOUT_SECONDS = 30.0
#: How long closing a session (and stopping a stdio server) may take before it is cancelled.
_CLOSE_SECONDS = 5.0
_NOT_NAME_SAFE = re.compile(r"[^A-Za-z0-9_-]")
#: Limits of a stdio server, which lives as long as the agent turn.
STDIO_LIMITS = containment.Limits(
    memory_bytes=1024 * containment.MIB,
    cpu_seconds=3600,
    file_bytes=256 * containment.MIB,
    processes=64,
)


class McpUnavailable(errors.AgentflowsError):
    """An MCP server could not be reached or listed; the message says why (no secret values)."""

    retryable = True


class McpRefused(McpUnavailable):
    """The server's URL points where no tool may connect; trying again cannot help."""

    retryable = False


def model_name(tool_name: str, server_tool: str, *, prefix: bool = True) -> str:
    """The name the model sees for ``server_tool`` of the Agent's ``mcp`` tool ``tool_name``."""
    name = f"{tool_name}_{server_tool}" if prefix else server_tool
    return _NOT_NAME_SAFE.sub("_", name)[:MAX_TOOL_NAME]


def selected(spec: agent_api.McpTool, server_tool: str) -> bool:
    """Tell whether the include/exclude filters offer ``server_tool``."""
    if spec.include and server_tool not in spec.include:
        return False
    return server_tool not in spec.exclude


async def discover_tools(
    tool: agent_api.Tool,
    env: Mapping[str, str],
    # The operator's contract names it so; it bounds connect + list, not one await.
    timeout: float = CONNECT_TIMEOUT_SECONDS,  # noqa: ASYNC109
    *,
    run_stdio: bool = False,
) -> list[str]:
    """Connect to the server of ``tool`` and return the names the model would be offered.

    For the operator's Agent status. Headers whose Secret is not in ``env`` are left out (the
    operator never reads secret values); a server that then answers 401/403 is reported as
    needing them. Raises :class:`McpUnavailable` when the server cannot be reached or listed
    within ``timeout`` seconds.

    A stdio server is a command: starting it runs whatever the Agent's author wrote with the
    caller's privileges. So it is refused (:class:`McpUnavailable` saying so) unless
    ``run_stdio`` is set — the operator should leave it unset (stdio tools are listed by the
    runner, in the run's own pod); tests and local tools may set it.
    """
    if tool.mcp is None:
        raise ValueError(f"tool {tool.name} is not an mcp tool")
    if tool.mcp.command is not None and not run_stdio:
        raise McpUnavailable(
            f"MCP tool {tool.name} is a stdio server (command {tool.mcp.command!r}); its tools "
            "are discovered when a runner pod starts it, not by the operator"
        )
    connection = _Connection(tool.name, tool.mcp, env, secrets.Redactor(), optional_headers=True)
    try:
        listed = await connection.open(timeout)
    finally:
        await connection.close()
    return [
        model_name(tool.name, entry.name, prefix=tool.mcp.prefix_names)
        for entry in listed
        if selected(tool.mcp, entry.name)
    ]


class McpToolProvider:
    """The tools of one MCP server for one agent turn (see module docstring)."""

    def __init__(
        self,
        tool: agent_api.Tool,
        env: Mapping[str, str],
        redactor: secrets.Redactor,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        assert tool.mcp is not None
        self._tool = tool
        self._spec = tool.mcp
        self._connect_timeout = connect_timeout
        self._connection = _Connection(tool.name, tool.mcp, env, redactor)
        #: model-visible name -> server tool name
        self._names: dict[str, str] = {}

    async def list_tools(self) -> list[tools.ToolDef]:
        """Connect and list the server's tools; unreachable is a retryable CapabilityError."""
        try:
            listed = await self._connection.open(self._connect_timeout)
        except McpUnavailable as exc:
            raise capabilities.CapabilityError(
                str(exc),
                retryable=exc.retryable,
                source=flow_api.RetryOn.TOOL,
            ) from None
        defs = []
        for entry in listed:
            if not selected(self._spec, entry.name):
                continue
            name = self.model_name(entry.name)
            self._names[name] = entry.name
            schema = entry.input_schema if isinstance(entry.input_schema, dict) else None
            defs.append(
                tools.ToolDef(
                    name=name,
                    description=entry.description or self._tool.description or entry.name,
                    parameters=schema,
                    read_only=self._tool.read_only,
                    source=self._connection.where(),
                )
            )
        return defs

    def model_name(self, server_tool: str) -> str:
        """The name the model sees for ``server_tool`` of this server."""
        return model_name(self._tool.name, server_tool, prefix=self._spec.prefix_names)

    def server_name(self, name: str) -> str | None:
        """The server's name for a tool, given its model-visible or its server name."""
        if name in self._names:
            return self._names[name]
        return name if name in self._names.values() else None

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Call the server tool behind ``name`` within the tool's ``timeoutSeconds``."""
        server_tool = self.server_name(name)
        if server_tool is None:
            return tools.ToolOutcome.failure(f"no tool named {name!r}")
        return await self._connection.call(server_tool, args, self._spec.timeout_seconds)

    async def aclose(self) -> None:
        """Close the session (and stop a stdio server); called when the turn ends."""
        await self._connection.close()


class _Connection:
    """One session with one server, held by an owner task from :meth:`open` to :meth:`close`."""

    def __init__(
        self,
        tool_name: str,
        spec: agent_api.McpTool,
        env: Mapping[str, str],
        redactor: secrets.Redactor,
        *,
        optional_headers: bool = False,
    ) -> None:
        self._tool_name = tool_name
        self._spec = spec
        self._env = env
        self._redactor = redactor
        self._optional_headers = optional_headers
        self._owner: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._client: Any = None
        #: HTTP statuses the server answered with, to explain a failed handshake.
        self._statuses: list[int] = []
        self._missing_headers: list[str] = []

    def where(self) -> str:
        if self._spec.url is not None:
            return f"MCP server {self._spec.url} (tool {self._tool_name})"
        return f"MCP server command {self._spec.command!r} (tool {self._tool_name})"

    async def open(self, seconds: float) -> list[Any]:
        """Connect and list every tool (all pages); raise McpUnavailable on failure.

        The SDK's client holds anyio task groups and cancel scopes, which must be entered and
        left by one task: a dedicated task owns the session from connect to :meth:`close`, so
        the timeout here can abandon a hanging handshake without tearing scopes across tasks.
        """
        ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(ready), name=f"mcp {self._tool_name}")
        try:
            return await asyncio.wait_for(asyncio.shield(ready), seconds)
        except TimeoutError:
            await self.close(abandon=True)
            raise McpUnavailable(f"{self.where()}: no answer within {seconds:g} s") from None
        except McpUnavailable:
            await self.close(abandon=True)
            raise

    async def _own(self, ready: asyncio.Future[list[Any]]) -> None:
        """The owner task: connect, list, then hold the session until close() is asked."""
        try:
            await self._check_url()
            async with contextlib.AsyncExitStack() as stack:
                self._client = await stack.enter_async_context(self._build_client(stack))
                listed: list[Any] = []
                cursor = None
                while True:
                    page = await self._client.list_tools(cursor=cursor)
                    listed.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                ready.set_result(listed)
                await self._closing.wait()
        except asyncio.CancelledError:
            raise
        except (egress.HostNotAllowed, egress.InvalidUrl) as exc:
            ready.set_exception(McpRefused(f"{self.where()}: {exc}"))
        except Exception as exc:
            if not ready.done():
                ready.set_exception(McpUnavailable(self._explain(exc)))
        finally:
            self._client = None
            if not ready.done():
                ready.cancel()

    async def _check_url(self) -> None:
        """Refuse a URL whose host is (or resolves to) an address no tool may call."""
        if self._spec.url is not None:
            guard = egress.Guard.for_url(self._spec.url)
            await guard.resolve(*guard.check_url(self._spec.url))

    def _build_client(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp import Client, StdioServerParameters

        if self._spec.command is not None:
            # Found here: the launcher would only report it on the server's stderr.
            search = self._spec.env.get("PATH", os.environ.get("PATH"))
            if shutil.which(self._spec.command, path=search) is None:
                raise FileNotFoundError(f"command {self._spec.command!r} is not found on PATH")
            launcher, *args = containment.command(
                [self._spec.command, *self._spec.args], STDIO_LIMITS
            )
            params = StdioServerParameters(command=launcher, args=args, env=dict(self._spec.env))
            return Client(params, cache=None)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert self._spec.url is not None
        guard = egress.Guard.for_url(self._spec.url)
        headers: dict[str, str] = {}
        for header, ref in self._spec.headers.items():
            if self._optional_headers and not self._env.get(secrets.secret_env_name(ref)):
                self._missing_headers.append(header)
                continue
            headers[header] = self._redactor.add(
                secrets.resolve(ref, self._env, field=f"mcp.headers.{header}")
            )

        async def record(response: Any) -> None:
            self._statuses.append(response.status_code)

        if self._spec.sse:
            from mcp.client.sse import sse_client

            def sse_http(
                headers: dict[str, str] | None = None,
                timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None,
            ) -> httpx2.AsyncClient:
                client: httpx2.AsyncClient = egress.async_client(
                    guard,
                    flavour="httpx2",
                    headers=headers,
                    timeout=timeout,
                    auth=auth,
                    event_hooks={"response": [record]},
                )
                return client

            transport = sse_client(self._spec.url, headers, httpx_client_factory=sse_http)
            return Client(transport, cache=None)
        http = egress.async_client(
            guard,
            flavour="httpx2",
            headers=headers,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [record]},
        )
        stack.push_async_callback(http.aclose)
        return Client(streamable_http_client(self._spec.url, http_client=http), cache=None)

    def _explain(self, exc: BaseException) -> str:
        if any(status in (401, 403) for status in self._statuses):
            status = next(s for s in self._statuses if s in (401, 403))
            hint = (
                f"; headers {', '.join(self._missing_headers)} come from Secrets and were not sent"
                if self._missing_headers
                else "; check the headers and their Secrets"
            )
            return f"{self.where()}: the server requires authentication (HTTP {status}){hint}"
        leaves = "; ".join(dict.fromkeys(_describe(leaf) for leaf in _leaves(exc)))
        return self._redactor(f"{self.where()}: cannot connect: {leaves}")

    async def call(self, server_tool: str, args: Any, seconds: float) -> tools.ToolOutcome:
        """Call one tool; the result's text (or structured content) or an error for the model."""
        import anyio

        if self._client is None:
            return tools.ToolOutcome.failure(f"{self.where()} is not connected")
        arguments = args if isinstance(args, dict) else {}
        try:
            with anyio.fail_after(seconds):
                result = await self._client.call_tool(server_tool, arguments)
        except TimeoutError:
            return tools.ToolOutcome.failure(
                f"{server_tool}: no answer within timeoutSeconds={seconds:g}", timeout=True
            )
        except Exception as exc:
            leaves = "; ".join(dict.fromkeys(_describe(leaf) for leaf in _leaves(exc)))
            return tools.ToolOutcome.failure(self._redactor(f"{server_tool}: {leaves}"))
        value = _result_value(result)
        if result.is_error:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            return tools.ToolOutcome.failure(self._redactor(f"{server_tool}: {text}"))
        # A server may echo what it was sent, secret headers included.
        return tools.ToolOutcome.success(self._redactor.value(value))

    async def close(self, *, abandon: bool = False) -> None:
        """Close the session: the owner task leaves its contexts.

        It is cancelled when ``abandon`` is set, or when a graceful close takes too long.
        """
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._closing.set()
        if not abandon:
            # asyncio.wait never raises the owner's outcome, and lets our own cancellation through.
            await asyncio.wait({owner}, timeout=_CLOSE_SECONDS)
        if not owner.done():
            owner.cancel()
            await asyncio.wait({owner}, timeout=_CLOSE_SECONDS)


def _result_value(result: Any) -> Any:
    """Structured content when the server gives it, else the text blocks joined (or JSON)."""
    if result.structured_content is not None:
        structured = result.structured_content
        if isinstance(structured, dict) and set(structured) == {"result"}:
            return structured["result"]
        return structured
    texts = []
    for block in result.content or []:
        text = getattr(block, "text", None)
        if text is not None:
            texts.append(str(text))
        else:
            texts.append(f"[{getattr(block, 'type', 'content')} content not shown]")
    return "\n".join(texts)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or the exception itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
