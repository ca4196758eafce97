"""MCP tool discovery for Agent status, in the background so a slow server never holds a worker.

Called by :mod:`agentflows.controller.agents`. For the HTTP ``mcp`` tools of an Agent it asks
each server for its tools (:func:`agentflows.agents.mcp.discover_tools`, concurrently, at most
``timeout`` seconds each, no Secret values: headers from Secrets are left out). stdio servers
are never started by the operator: their tools are found when a runner pod starts them.

:meth:`ToolDiscovery.lookup` never waits: it returns the result for the Agent's current version
(uid and generation), starting a discovery when there is none, and the Agent is enqueued again
when a discovery finishes. Results are kept per version in memory only; a failed discovery is
tried again ``retry_seconds`` after it ended (the last result stands meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from agentflows.agents import mcp
from agentflows.api import agent as agent_api

log = logging.getLogger(__name__)

#: The Agent condition that says whether its MCP servers' tools could be listed.
TOOLS_DISCOVERED = "ToolsDiscovered"
#: Seconds to connect to one MCP server and list its tools.
TIMEOUT_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Discovered:
    """Tool names the model is offered by the servers that answered, and why others did not."""

    names: list[str]
    errors: list[str]
    finished_at: float


@dataclasses.dataclass
class _Entry:
    version: str
    result: Discovered | None = None
    task: asyncio.Task[None] | None = None


def http_servers(spec: agent_api.AgentSpec) -> list[agent_api.Tool]:
    """The Agent's ``mcp`` tools the operator may ask: those with a ``url``."""
    return [t for t in spec.tools if t.mcp is not None and t.mcp.command is None]


def stdio_servers(spec: agent_api.AgentSpec) -> list[agent_api.Tool]:
    """The Agent's ``mcp`` tools that are commands, started only inside runner pods."""
    return [t for t in spec.tools if t.mcp is not None and t.mcp.command is not None]


class ToolDiscovery:
    """Background discoveries and their results, by Agent (namespace, name)."""

    def __init__(
        self,
        on_done: Callable[[str, str], None],
        *,
        timeout: float = TIMEOUT_SECONDS,
        retry_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_done = on_done
        self._timeout = timeout
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._entries: dict[tuple[str, str], _Entry] = {}

    def lookup(
        self, namespace: str, name: str, version: str, tools: Sequence[agent_api.Tool]
    ) -> Discovered | None:
        """The latest result for this version of the Agent; None while the first one runs."""
        key = (namespace, name)
        entry = self._entries.get(key)
        if entry is None or entry.version != version:
            if entry is not None and entry.task is not None:
                entry.task.cancel()
            entry = self._entries[key] = _Entry(version)
        running = entry.task is not None and not entry.task.done()
        result = entry.result
        stale = result is None or (
            bool(result.errors) and self._clock() - result.finished_at >= self._retry_seconds
        )
        if stale and not running:
            entry.task = asyncio.create_task(
                self._discover(key, entry, list(tools)), name=f"mcp discovery {namespace}/{name}"
            )
        return result

    def forget(self, namespace: str, name: str) -> None:
        """The Agent is gone: drop its result and stop its discovery."""
        entry = self._entries.pop((namespace, name), None)
        if entry is not None and entry.task is not None:
            entry.task.cancel()

    async def close(self) -> None:
        """Stop every discovery (operator shutdown)."""
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        self._entries.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _discover(
        self, key: tuple[str, str], entry: _Entry, tools: list[agent_api.Tool]
    ) -> None:
        outcomes = await asyncio.gather(*(self._one(tool) for tool in tools))
        names = [name for found, _ in outcomes for name in found]
        errors = [error for _, error in outcomes if error]
        entry.result = Discovered(names, errors, self._clock())
        if self._entries.get(key) is entry:
            self._on_done(*key)

    async def _one(self, tool: agent_api.Tool) -> tuple[list[str], str]:
        try:
            # discover_tools bounds connect + list; the margin also bounds closing the session.
            async with asyncio.timeout(self._timeout + 5):
                return await mcp.discover_tools(tool, {}, timeout=self._timeout), ""
        except mcp.McpUnavailable as exc:
            return [], f"{tool.name}: {exc}"
        except TimeoutError:
            return [], f"{tool.name}: no answer within {self._timeout:g} s"
        except Exception as exc:  # a server's bad answer must not take the operator down
            log.warning("discovering the tools of MCP tool %s failed", tool.name, exc_info=True)
            return [], f"{tool.name}: {exc}"
