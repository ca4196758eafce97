"""The run loop: execute a compiled flow against a checkpoint store and capabilities.

One :class:`Run` per run holds what every (sub-)flow of it shares: the store, the loaded
checkpoint, the capabilities, the limits and the usage totals. One :class:`_Execution` per
(sub-)flow schedules its nodes: the successors of a finished node start concurrently; a node
with several predecessors waits until each is settled (finished or skipped) and starts when at
least one edge into it was taken, else it is skipped (dead-path elimination).

Every node's record reaches the store before its dependants start, and a node recorded as
finished is never executed again, so a run resumed from its store continues where it stopped.
Node kinds live in :mod:`agentflows.engine.nodes`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from agentflows.api import common, schemas
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, expressions, graph, store

Phase = flowrun_api.NodePhase
FINISHED = (Phase.SUCCEEDED, Phase.FAILED, Phase.SKIPPED)


def now() -> dt.datetime:
    """The current time in UTC."""
    return dt.datetime.now(dt.UTC)


def timestamp(moment: dt.datetime | None = None) -> str:
    """RFC 3339 with seconds precision and a Z, as Kubernetes writes times."""
    return (moment or now()).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> dt.datetime:
    """Parse an RFC 3339 time written by :func:`timestamp` or Kubernetes."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclasses.dataclass(frozen=True)
class RunEvent:
    """Progress of a run, for a host to show (CLI) or turn into Events (operator)."""

    kind: str  # "started", "succeeded", "failed", "waiting", "skipped"
    key: str
    node_kind: str
    status: flowrun_api.NodeStatus | None = None


Observer = Callable[[RunEvent], None]


class RunStopped(Exception):
    """The run cannot go on: a node failed or a limit was hit. Not retryable by re-running."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _Paused(Exception):
    """Internal: a (sub-)execution ended waiting for a human."""


@dataclasses.dataclass
class Run:
    """Shared state of one run, across its sub-flows."""

    name: str
    spec: flow_api.FlowSpec
    checkpoints: store.CheckpointStore
    caps: capabilities.Capabilities
    resolver: capabilities.Resolver
    checkpoint: store.Checkpoint
    observer: Observer | None = None
    usage: common.Usage = dataclasses.field(default_factory=common.Usage)
    executions: int = 0

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

    async def save_request(self, request_id: str, request: flowrun_api.HumanRequest) -> None:
        """Persist a new request."""
        self.checkpoint.requests[request_id] = request
        await self.checkpoints.save_request(request_id, request)

    def count_execution(self) -> None:
        """Count one node execution against limits.maxNodeExecutions."""
        self.executions += 1
        limit = self.spec.limits.max_node_executions
        if self.executions > limit:
            raise RunStopped(
                "NodeExecutionLimitExceeded",
                f"run exceeded limits.maxNodeExecutions={limit}",
            )

    def add_usage(self, usage: common.Usage | None) -> None:
        """Add usage and stop the run when a token or cost limit is passed."""
        if usage is None:
            return
        self.usage = self.usage.add(usage)
        limits = self.spec.limits
        total = self.usage.prompt_tokens + self.usage.completion_tokens
        if limits.max_tokens is not None and total > limits.max_tokens:
            raise RunStopped(
                "TokenLimitExceeded",
                f"run used {total} tokens, over limits.maxTokens={limits.max_tokens}",
            )
        if limits.max_cost_usd is not None and self.usage.cost_usd > limits.max_cost_usd:
            raise RunStopped(
                "CostLimitExceeded",
                f"run cost ${self.usage.cost_usd:.4f}, "
                f"over limits.maxCostUSD={limits.max_cost_usd}",
            )

    def context(
        self, key: str, depth: int, resume: capabilities.Resume | None
    ) -> capabilities.NodeContext:
        """The NodeContext capabilities receive."""
        limits = self.spec.limits
        used = self.usage.prompt_tokens + self.usage.completion_tokens
        return capabilities.NodeContext(
            run_name=self.name,
            node_key=key,
            depth=depth,
            autonomy=self.spec.autonomy,
            resume=resume,
            run_flow=self.run_subflow,
            tokens_left=None if limits.max_tokens is None else max(limits.max_tokens - used, 0),
            cost_left_usd=None
            if limits.max_cost_usd is None
            else max(limits.max_cost_usd - self.usage.cost_usd, 0.0),
        )

    async def run_subflow(self, name: str, value: Any, ctx: capabilities.NodeContext) -> Any:
        """Run Flow ``name`` inside this run with its nodes stored under ``ctx.node_key/``."""
        compiled = self.compile_subflow(name, ctx.depth + 1)
        execution = _Execution(self, compiled, f"{ctx.node_key}/", ctx.depth + 1, value)
        try:
            return await execution.execute()
        except _Paused as exc:
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


class ScopeBuilder:
    """Builds the expression scope as JSON text, serialising each node output only once."""

    def __init__(self, run_values: dict[str, Any]) -> None:
        self.run_values = run_values
        self._run_json = json.dumps(run_values, ensure_ascii=False, default=str)
        self._outputs: dict[str, Any] = {}
        self._parts: dict[str, str] = {}

    def add(self, node_id: str, output: Any) -> None:
        """Make a node's output visible at ``.nodes.<id>``."""
        self._outputs[node_id] = output
        self._parts[node_id] = (
            json.dumps(node_id) + ":" + json.dumps(output, ensure_ascii=False, default=str)
        )

    @property
    def outputs(self) -> dict[str, Any]:
        """Outputs by node id."""
        return self._outputs

    def scope(self, **extra: Any) -> expressions.Scope:
        """The scope ``{run, nodes, ...extra}``."""
        tail = "".join(
            "," + json.dumps(key) + ":" + json.dumps(value, ensure_ascii=False, default=str)
            for key, value in extra.items()
        )
        parts = self._parts

        def render(needs: frozenset[str] | None) -> str:
            if needs is None:
                chosen = ",".join(parts.values())
            else:
                chosen = ",".join(parts[n] for n in needs if n in parts)
            return '{"run":' + self._run_json + ',"nodes":{' + chosen + "}" + tail + "}"

        values = {"run": self.run_values, "nodes": self._outputs, **extra}
        return expressions.Scope(values, render)


class _Execution:
    """Schedules the nodes of one (sub-)flow."""

    def __init__(
        self, run: Run, compiled: graph.CompiledFlow, prefix: str, depth: int, value: Any
    ) -> None:
        self.run = run
        self.compiled = compiled
        self.prefix = prefix
        self.depth = depth
        self.input = value
        run_values: dict[str, Any] = {"name": run.name, "input": value}
        if run.checkpoint.run is not None and not prefix:
            run_values["trigger"] = run.checkpoint.run.trigger
        self.scope = ScopeBuilder(run_values)

    def key(self, node_id: str) -> str:
        """Status key of a node of this execution."""
        return self.prefix + node_id

    def _taken(self, source: str, target: str) -> bool:
        record = self.run.checkpoint.nodes.get(self.key(source))
        if record is None or record.phase != Phase.SUCCEEDED:
            return False
        node = self.compiled.nodes[source]
        if node.kind != "branch":
            return True
        chosen = (record.output or {}).get("json", {}) or {}
        return bool(chosen.get("next") == target)

    async def execute(self) -> Any:
        """Run to the end; return the output, raise _Paused or RunStopped.

        A ready queue: each node counts its unsettled predecessors; when a node settles
        (succeeds or is skipped), its successors' counts drop, and a node at zero is either
        started (some edge into it was taken) or skipped (dead-path elimination).
        """
        from agentflows.engine import nodes  # the node kinds need _Execution; import late

        graph_nodes = self.compiled.nodes
        settled: set[str] = set()
        for node_id in graph_nodes:
            record = self.run.checkpoint.nodes.get(self.key(node_id))
            if record is not None and record.phase in FINISHED:
                settled.add(node_id)
                if record.phase == Phase.SUCCEEDED:
                    self.scope.add(node_id, record.output)
        unsettled = {
            node_id: sum(1 for p in node.predecessors if p not in settled)
            for node_id, node in graph_nodes.items()
        }
        ready = [n for n in graph_nodes if n not in settled and unsettled[n] == 0]
        running: dict[asyncio.Task[Phase], str] = {}
        waiting = False

        def settle(node_id: str) -> None:
            settled.add(node_id)
            for successor in graph_nodes[node_id].successors:
                unsettled[successor] -= 1
                if unsettled[successor] == 0 and successor not in settled:
                    ready.append(successor)

        try:
            while ready or running:
                while ready:
                    node_id = ready.pop(0)
                    node = graph_nodes[node_id]
                    if node.predecessors and not any(
                        self._taken(p, node_id) for p in node.predecessors
                    ):
                        status = flowrun_api.NodeStatus(
                            phase=Phase.SKIPPED, finished_at=timestamp()
                        )
                        await self.run.save_node(self.key(node_id), status)
                        self.run.emit("skipped", self.key(node_id), node.kind, status)
                        settle(node_id)
                        continue
                    running[asyncio.create_task(nodes.execute(self, node))] = node_id
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    node_id = running.pop(task)
                    if task.result() == Phase.WAITING:
                        waiting = True
                    else:
                        settle(node_id)
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        if waiting:
            raise _Paused()
        return self.output()

    def output(self) -> Any:
        """The run output: the output expression, else the finished sinks' json."""
        if self.compiled.output is not None:
            try:
                return expressions.evaluate(self.compiled.output, self.scope.scope())
            except expressions.ExpressionError as exc:
                raise RunStopped("OutputFailed", f"spec.output: {exc}") from exc
        outputs = self.scope.outputs
        sinks = [s for s in self.compiled.sinks if s in outputs]
        if len(sinks) == 1:
            return (outputs[sinks[0]] or {}).get("json")
        return {s: (outputs[s] or {}).get("json") for s in sinks}


def input_problems(schema: Any, value: Any) -> list[str]:
    """Why ``value`` does not match the Flow's input ``schema``, one ``input.<path>: ...`` each."""
    if schema is None:
        return []
    validator = schemas.validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        problems.append(f"input{path}: {error.message}")
    return problems


def total_usage(checkpoint: store.Checkpoint) -> common.Usage:
    """Usage of every node recorded in the checkpoint."""
    total = common.Usage()
    for record in checkpoint.nodes.values():
        if record.usage is not None:
            total = total.add(record.usage)
    return total


async def run_flow(
    compiled: graph.CompiledFlow,
    *,
    run_name: str,
    input_value: Any,
    store_: store.CheckpointStore,
    caps: capabilities.Capabilities,
    resolver: capabilities.Resolver,
    trigger: Any = None,
    observer: Observer | None = None,
) -> store.Outcome:
    """Run (or resume) a flow to its end or its next pause, and return the outcome.

    A run whose store already holds a terminal outcome is returned as it is. The stored input
    wins over ``input_value`` on resume, so a resumed run sees what it started with.
    """
    checkpoint = await store_.load()
    if checkpoint.outcome is not None and checkpoint.outcome.phase.terminal:
        return checkpoint.outcome
    run = Run(run_name, compiled.spec, store_, caps, resolver, checkpoint, observer)
    run.usage = total_usage(checkpoint)
    run.executions = sum(r.attempts for r in checkpoint.nodes.values())
    if checkpoint.run is None:
        checkpoint.run = store.RunRecord(run_name, input_value, trigger, timestamp())
        await store_.save_run(checkpoint.run)
    started = parse_time(checkpoint.run.started_at)
    outcome = await _run_with_limits(run, compiled, checkpoint.run.input, started)
    outcome.usage = run.usage
    await store_.save_outcome(outcome)
    return outcome


async def _run_with_limits(
    run: Run, compiled: graph.CompiledFlow, value: Any, started: dt.datetime
) -> store.Outcome:
    problems = input_problems(compiled.spec.input, value)
    if problems:
        return store.Outcome(
            flowrun_api.RunPhase.FAILED,
            message="invalid input: " + "; ".join(problems),
            reason="InvalidInput",
            completed_at=timestamp(),
        )
    timeout = compiled.spec.limits.timeout_seconds
    remaining = None if timeout is None else timeout - (now() - started).total_seconds()
    execution = _Execution(run, compiled, "", 0, value)
    try:
        if remaining is not None and remaining <= 0:
            raise TimeoutError
        async with asyncio.timeout(remaining):
            output = await execution.execute()
    except _Paused:
        return store.Outcome(
            flowrun_api.RunPhase.WAITING, reason="Waiting", message=_waiting_message(run)
        )
    except RunStopped as exc:
        return store.Outcome(
            flowrun_api.RunPhase.FAILED,
            message=exc.message,
            reason=exc.reason,
            completed_at=timestamp(),
        )
    except TimeoutError:
        return store.Outcome(
            flowrun_api.RunPhase.FAILED,
            message=f"run exceeded limits.timeoutSeconds={timeout} (started {timestamp(started)})",
            reason="Timeout",
            completed_at=timestamp(),
        )
    return store.Outcome(
        flowrun_api.RunPhase.SUCCEEDED, output=output, reason="Succeeded", completed_at=timestamp()
    )


def _waiting_message(run: Run) -> str:
    pending = [rid for rid, r in run.checkpoint.requests.items() if r.decision is None]
    return (
        "waiting for " + ", ".join(f'request "{rid}"' for rid in pending) if pending else "waiting"
    )
