"""What one run shares while it executes: the :class:`Run`, and a :class:`Frame` per (sub-)flow.

The run loop (:mod:`agentflows.engine.run`) creates both; node kinds
(:mod:`agentflows.engine.nodes`) and the node-record lifecycle
(:mod:`agentflows.engine.lifecycle`) read and update them. Sub-flows are started through
:attr:`Run.execute_flow`, the loop's entry point handed in by the loop, so no module here
imports the loop.

Also here: the values node kinds return (:class:`Waiting`, ``NodeResult``) and the exceptions
that end a node or a run (:class:`NodeFailed`, :class:`RunStopped`, :class:`Paused`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from agentflows.api import common, errors, times
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, graph, scope, store

Reason = flowrun_api.RunReason


@dataclasses.dataclass(frozen=True)
class RunEvent:
    """Progress of a run, for a host to show (CLI) or turn into Events (operator)."""

    kind: str  # "started", "retrying", "succeeded", "failed", "waiting", "skipped"
    key: str
    node_kind: str
    status: flowrun_api.NodeStatus | None = None


Observer = Callable[[RunEvent], None]


class RunStopped(errors.PermanentError):
    """The run cannot go on: a node failed or a limit was hit. Re-running does not help."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class NodeFailed(errors.PermanentError):
    """A node kind decided the node failed (a rejection, an expiry, a missing Agent)."""

    def __init__(self, message: str, *, reason: Reason = Reason.NODE_FAILED) -> None:
        super().__init__(message)
        self.reason = reason


class Paused(Exception):
    """Internal: a (sub-)flow ended waiting for a human."""


@dataclasses.dataclass
class Waiting:
    """A node kind's result meaning: a request is pending; persist it and stop this path."""

    request_id: str
    state: Any = None
    usage: common.Usage = dataclasses.field(default_factory=common.Usage)
    detail: Any = None


#: What a node kind returns.
Result = capabilities.NodeResult | Waiting


@dataclasses.dataclass(frozen=True)
class Cap:
    """A ceiling on what a run uses in total: the Flow's limits, or one its host adds.

    ``tokens_name`` and ``cost_name`` say in the run's message what was passed
    (``limits.maxTokens=1000``); ``reason`` (None: TokenLimitExceeded or CostLimitExceeded)
    is the run's reason when it stops.
    """

    max_tokens: int | None
    max_cost_usd: float | None
    tokens_name: str
    cost_name: str
    reason: Reason | None = None


@dataclasses.dataclass
class Frame:
    """One (sub-)flow of a run: its graph, its status-key prefix, depth, input and scope."""

    run: Run
    compiled: graph.CompiledFlow
    prefix: str
    depth: int
    input: Any
    scope: scope.ScopeBuilder = dataclasses.field(init=False)
    #: The iteration each loop of this (sub-)flow is in, by head (1 when absent).
    iterations: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        run_values: dict[str, Any] = {"name": self.run.name, "input": self.input}
        if self.run.checkpoint.run is not None and not self.prefix:
            run_values["trigger"] = self.run.checkpoint.run.trigger
        self.scope = scope.ScopeBuilder(run_values, deadline=self.run.deadline)

    def iteration(self, node_id: str) -> int:
        """The iteration of its loop a node is in (1 outside loops)."""
        node = self.compiled.nodes.get(node_id)
        head = node.loop if node is not None else None
        return self.iterations.get(head, 1) if head is not None else 1

    def key(self, node_id: str, iteration: int | None = None) -> str:
        """Status key of a node of this (sub-)flow: ``<id>``, then ``<id>#2``, ``<id>#3``..."""
        n = self.iteration(node_id) if iteration is None else iteration
        return self.prefix + node_id + (f"#{n}" if n > 1 else "")


#: Runs a frame's nodes to the end; returns the output, raises Paused or RunStopped.
FlowExecutor = Callable[[Frame], Awaitable[Any]]


@dataclasses.dataclass
class Run:
    """Shared state of one run, across its sub-flows."""

    name: str
    spec: flow_api.FlowSpec
    checkpoints: store.CheckpointStore
    caps: capabilities.Capabilities
    resolver: capabilities.Resolver
    checkpoint: store.Checkpoint
    execute_flow: FlowExecutor
    clock: times.Clock = times.now
    observer: Observer | None = None
    usage: common.Usage = dataclasses.field(default_factory=common.Usage)
    executions: int = 0
    #: The end of limits.timeoutSeconds as a time.monotonic() instant (None: no limit); every
    #: expression evaluated for this run stops by then.
    deadline: float | None = None
    #: Caps the host adds to the Flow's limits (a namespace budget), enforced the same way.
    ceilings: tuple[Cap, ...] = ()

    def timestamp(self) -> str:
        """Now, by the run's clock, in RFC 3339."""
        return times.timestamp(self.clock())

    def emit(
        self, kind: str, key: str, node_kind: str, status: flowrun_api.NodeStatus | None
    ) -> None:
        """Tell the observer."""
        if self.observer is not None:
            self.observer(RunEvent(kind, key, node_kind, status))

    async def save_node(self, key: str, status: flowrun_api.NodeStatus) -> None:
        """Persist a node record and keep it in the loaded checkpoint."""
        self.checkpoint.nodes[key] = status
        await self.checkpoints.save_node(key, status)

    async def fold_nodes(
        self, folded: dict[str, flowrun_api.NodeStatus], removed: list[str]
    ) -> None:
        """Persist a fold of finished records (one store write) and apply it to the checkpoint."""
        await self.checkpoints.fold_nodes(folded, removed)
        for key in removed:
            self.checkpoint.nodes.pop(key, None)
        self.checkpoint.nodes.update(folded)

    async def save_request(self, request_id: str, request: flowrun_api.HumanRequest) -> None:
        """Persist a new request."""
        self.checkpoint.requests[request_id] = request
        await self.checkpoints.save_request(request_id, request)

    def executions_left(self) -> int:
        """Node executions limits.maxNodeExecutions still allows."""
        return self.spec.limits.max_node_executions - self.executions

    def count_execution(self) -> None:
        """Count one node execution against limits.maxNodeExecutions."""
        self.executions += 1
        if self.executions_left() < 0:
            raise RunStopped(
                Reason.NODE_EXECUTION_LIMIT_EXCEEDED,
                f"run exceeded limits.maxNodeExecutions={self.spec.limits.max_node_executions}",
            )

    def all_caps(self) -> list[Cap]:
        """The Flow's limits.maxTokens and maxCostUSD, then the host's :attr:`ceilings`."""
        limits = self.spec.limits
        flow_cap = Cap(
            limits.max_tokens,
            limits.max_cost_usd,
            f"limits.maxTokens={limits.max_tokens}",
            f"limits.maxCostUSD={limits.max_cost_usd}",
        )
        return [flow_cap, *self.ceilings]

    def add_usage(self, usage: common.Usage) -> None:
        """Add usage and stop the run when a token or cost cap is passed."""
        self.usage = self.usage.add(usage)
        total = self.usage.prompt_tokens + self.usage.completion_tokens
        for cap in self.all_caps():
            if cap.max_tokens is not None and total > cap.max_tokens:
                reason = cap.reason or Reason.TOKEN_LIMIT_EXCEEDED
                raise RunStopped(reason, f"run used {total} tokens, over {cap.tokens_name}")
            if cap.max_cost_usd is not None and self.usage.cost_usd > cap.max_cost_usd:
                reason = cap.reason or Reason.COST_LIMIT_EXCEEDED
                raise RunStopped(
                    reason, f"run cost ${self.usage.cost_usd:.4f}, over {cap.cost_name}"
                )

    def context(
        self, key: str, depth: int, resume: capabilities.Resume | None, progress: Any = None
    ) -> capabilities.NodeContext:
        """The NodeContext capabilities receive; ``progress``: what an earlier execution kept.

        Its budget is what the tightest cap leaves.
        """
        used = self.usage.prompt_tokens + self.usage.completion_tokens
        ceilings = self.all_caps()
        tokens = [c.max_tokens - used for c in ceilings if c.max_tokens is not None]
        costs = [
            c.max_cost_usd - self.usage.cost_usd for c in ceilings if c.max_cost_usd is not None
        ]
        return capabilities.NodeContext(
            run_name=self.name,
            node_key=key,
            depth=depth,
            autonomy=self.spec.autonomy,
            resume=resume,
            run_flow=self.run_subflow,
            tokens_left=max(min(tokens), 0) if tokens else None,
            cost_left_usd=max(min(costs), 0.0) if costs else None,
            progress=progress,
            save_progress=functools.partial(self.save_progress, key),
        )

    async def save_progress(self, key: str, value: Any) -> None:
        """Keep ``value`` on node ``key``'s Running record, for an execution after a kill."""
        record = self.checkpoint.nodes.get(key)
        if record is not None and record.phase == flowrun_api.NodePhase.RUNNING:
            await self.save_node(key, record.model_copy(update={"detail": {"progress": value}}))

    async def run_subflow(self, name: str, value: Any, ctx: capabilities.NodeContext) -> Any:
        """Run Flow ``name`` for an agent, with its nodes stored under ``ctx.node_key/``."""
        compiled = self.compile_subflow(name, ctx.depth + 1)
        try:
            return await self.execute_flow(
                Frame(self, compiled, f"{ctx.node_key}/", ctx.depth + 1, value)
            )
        except Paused as exc:
            raise capabilities.CapabilityError(
                f'sub-flow "{name}" paused for a human; sub-flows called by agents cannot pause'
            ) from exc

    def compile_subflow(self, name: str, depth: int) -> graph.CompiledFlow:
        """Compile a sub-flow, failing clearly on depth, a missing Flow or a bad one."""
        if depth > capabilities.MAX_DEPTH:
            raise capabilities.CapabilityError(
                f'sub-flow "{name}" would nest deeper than {capabilities.MAX_DEPTH} levels'
            )
        spec = self.resolver.flow(name)
        if spec is None:
            raise capabilities.CapabilityError(f'no Flow "{name}"')
        try:
            return graph.compile_flow(spec, self.resolver, prefix=f"flow {name}")
        except graph.FlowInvalid as exc:
            raise capabilities.CapabilityError(f'Flow "{name}" is invalid: {exc}') from exc
