"""Node tools: other nodes of the agent's Flow offered to the model (``agent.nodeTools``).

Built by :mod:`agentflows.agents.host` for an agent turn whose task carries
:class:`~agentflows.engine.capabilities.NodeToolOffer` s (the engine compiled them from the
Flow). Each offer becomes a function named after its node; a name already taken by another tool
of the turn, or by an earlier offer, gets ``_2``, ``_3`` ... appended. The parameters are only
the fields the Flow lists.

A call runs the node once through :attr:`~agentflows.engine.capabilities.NodeContext.run_node`,
the engine's own node execution (its record lands in status under ``<node>/<call id>/<tool
node>``, its usage is counted by the engine), and returns the node's output: parsed JSON when it
has some, else its text. The call is recorded like any other in the agent node's tool calls.
A failed node is an error result for the model; a run limit hit inside it stops the run.

Node tools are offered as read-only, like sub-agents: what the node does is governed by the
autonomy it runs under itself (a tool node that is not read-only fails under ``readonly``, and
one that would wait for a human under ``supervised`` is an error result for the model).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agentflows.agents import delegation, tools
from agentflows.api import common
from agentflows.engine import capabilities, state


def unique_names(wanted: Sequence[str], taken: Iterable[str]) -> list[str]:
    """``wanted`` with ``_2``, ``_3`` ... appended to each name already used."""
    used = set(taken)
    names = []
    for name in wanted:
        chosen, n = name, 1
        while chosen in used:
            n += 1
            chosen = f"{name}_{n}"
        used.add(chosen)
        names.append(chosen)
    return names


class NodeToolProvider:
    """The agent node's nodeTools, named so that no other tool of the turn has their name."""

    def __init__(
        self, offers: Sequence[capabilities.NodeToolOffer], taken: Iterable[str] = ()
    ) -> None:
        names = unique_names([offer.node for offer in offers], taken)
        self._offers = dict(zip(names, offers, strict=True))

    async def list_tools(self) -> list[tools.ToolDef]:
        """One tool per offered node."""
        return [
            tools.ToolDef(
                name=name,
                description=offer.description,
                parameters=offer.parameters,
                read_only=True,
            )
            for name, offer in self._offers.items()
        ]

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Run the node once with the model's arguments and return its output."""
        offer = self._offers[name]
        if ctx.run_node is None:
            return tools.ToolOutcome.failure("flow nodes cannot run here (no engine run)")
        try:
            output = await ctx.run_node(offer.node, dict(args or {}), ctx)
        except state.RunStopped as exc:
            if exc.reason in delegation.RUN_LIMIT_REASONS:
                raise
            return tools.ToolOutcome.failure(f"node {offer.node!r} failed: {exc.message}")
        value = output.get("json") if output.get("json") is not None else output.get("text")
        # The engine counts the node's usage on its own record: none is returned here.
        return tools.ToolOutcome("success", value=value, usage=common.Usage())
