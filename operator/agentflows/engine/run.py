"""The run loop: execute a compiled flow against a checkpoint store and capabilities.

One :class:`state.Run` per run holds what every (sub-)flow of it shares: the store, the loaded
checkpoint, the capabilities, the limits, the usage totals and the clock. For each (sub-)flow,
:func:`execute_frame` schedules the nodes of a :class:`state.Frame`: the successors of a
finished node start concurrently; a node with several predecessors waits until each is settled
(finished or skipped) and starts when at least one edge into it was taken, else it is skipped
(dead-path elimination).

Every node's record reaches the store before its dependants start, and a node recorded as
finished is never executed again, so a run resumed from its store continues where it stopped.
Node kinds live in :mod:`agentflows.engine.nodes`; every node record is written by
:mod:`agentflows.engine.lifecycle`. One execution of a run (one attempt: a pod, a CLI call) is
one ``run`` span (:mod:`agentflows.engine.spans`), parent of its nodes' spans.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import time
from typing import Any

from agentflows.api import common, schemas, times
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.engine import (
    capabilities,
    expressions,
    graph,
    lifecycle,
    loops,
    nodes,
    spans,
    state,
    store,
)

Phase = flowrun_api.NodePhase
Reason = flowrun_api.RunReason
FINISHED = (Phase.SUCCEEDED, Phase.FAILED, Phase.SKIPPED)


def _taken(frame: state.Frame, source: str, target: str) -> bool:
    record = frame.run.checkpoint.nodes.get(frame.key(source))
    if record is None or record.phase != Phase.SUCCEEDED:
        return False
    node = frame.compiled.nodes[source]
    if node.kind != "branch":
        return True
    chosen = (record.output or {}).get("json", {}) or {}
    return bool(chosen.get("next") == target)


class _Schedule:
    """Which nodes of a frame are settled and which may start, loops included.

    The graph without back edges is a DAG. A node outside a loop that follows a node of the
    loop waits until the loop has exited. When every node of a loop's body has settled, the
    loop either exits (no back edge taken) or starts its next iteration: the body is unsettled
    again and its nodes' records go to keys ``<id>#<iteration>``. A loop that started an
    iteration is in :attr:`entered` until its older iterations are folded (:func:`_fold`).
    """

    def __init__(self, frame: state.Frame) -> None:
        self.frame = frame
        self.nodes = frame.compiled.nodes
        self.settled: set[str] = set()
        self.exited: set[str] = set()
        self.ready: list[str] = []
        self.started: set[str] = set()
        #: Heads of loops to fold: each loop once on resume, then each one that re-enters.
        self.entered: set[str] = set(frame.compiled.loops)
        #: Loop nodes whose iterations a fold looks up rather than searches for.
        self.leaves = frozenset(
            n for n, node in self.nodes.items() if node.loop and node.kind in nodes.LEAF_KINDS
        )
        for loop in frame.compiled.loops.values():
            frame.iterations[loop.head] = self._stored_iteration(loop)
            self._load_history(loop)
        for node_id, node in self.nodes.items():
            record = frame.run.checkpoint.nodes.get(frame.key(node_id))
            if record is not None and record.phase in FINISHED:
                self.settled.add(node_id)
                if record.phase == Phase.SUCCEEDED:
                    nodes.check_human_record(frame, node, record)
                    frame.scope.add(node_id, record.output, self._iteration_of(node_id))
        candidates = list(self.nodes)
        for head in frame.compiled.loops:
            candidates.extend(self._close(head))
        self._consider(candidates)

    def _iteration_of(self, node_id: str) -> int | None:
        return self.frame.iteration(node_id) if self.nodes[node_id].loop else None

    def _stored_iteration(self, loop: loops.Loop) -> int:
        records = self.frame.run.checkpoint.nodes
        return max(flowrun_api.latest_iteration(records, self.frame.key(b, 1)) for b in loop.body)

    def _load_history(self, loop: loops.Loop) -> None:
        """Earlier iterations' outputs, for ``.iterations.<id>``; a fold's for ``.nodes.<id>``."""
        records = self.frame.run.checkpoint.nodes
        for n in range(1, self.frame.iterations[loop.head]):
            for node_id in sorted(loop.body):
                key = self.frame.key(node_id, n)
                record = records.get(key)
                if record is not None and record.phase == Phase.SUCCEEDED:
                    self.frame.scope.add(node_id, record.output, n)
                elif record is None and n == 2:
                    fold = flowrun_api.fold_holding(records, key)
                    if fold is not None and records[fold].phase == Phase.SUCCEEDED:
                        self.frame.scope.add(node_id, records[fold].output)

    def _done_for(self, pred: str, node_id: str) -> bool:
        loop = self.nodes[pred].loop
        return pred in self.settled and (
            loop is None or loop == self.nodes[node_id].loop or loop in self.exited
        )

    def _consider(self, candidates: list[str]) -> None:
        for node_id in dict.fromkeys(candidates):
            if node_id in self.settled or node_id in self.started:
                continue
            if all(self._done_for(p, node_id) for p in self.nodes[node_id].predecessors):
                self.started.add(node_id)
                self.ready.append(node_id)

    def settle(self, node_id: str) -> None:
        """Node ``node_id`` succeeded or was skipped: queue what may start now."""
        self.settled.add(node_id)
        self.started.discard(node_id)
        candidates = list(self.nodes[node_id].successors)
        head = self.nodes[node_id].loop
        if head is not None:
            candidates.extend(self._close(head))
        self._consider(candidates)

    def _close(self, head: str) -> list[str]:
        """A loop whose body has settled exits or starts again; the nodes that may start now."""
        loop = self.frame.compiled.loops[head]
        if head in self.exited or not loop.body <= self.settled:
            return []
        if not any(_taken(self.frame, s, head) for s in loop.sources):
            self.exited.add(head)
            return [s for b in loop.body for s in self.nodes[b].successors]
        iteration = self.frame.iterations[head]
        if iteration >= loop.max_iterations:
            raise state.RunStopped(
                Reason.LOOP_ITERATION_LIMIT_EXCEEDED,
                f"loop {loop.describe()} would start iteration {iteration + 1}, over the "
                f'maxIterations={loop.max_iterations} of node "{self.frame.key(head, 1)}"',
            )
        self.frame.iterations[head] = iteration + 1
        self.settled -= loop.body
        self.entered.add(head)
        return [head]


async def _fold(frame: state.Frame, schedule: _Schedule) -> None:
    """Fold the older iterations of each loop that entered one (see :func:`loops.fold`)."""
    for head in sorted(schedule.entered):
        loop = frame.compiled.loops[head]
        records = frame.run.checkpoint.nodes
        folded, removed, iterations = loops.fold(
            records, frame.prefix, loop, frame.iterations[head], schedule.leaves
        )
        if removed:
            await frame.run.fold_nodes(folded, removed)
            for node_id in loop.body:
                frame.scope.forget(node_id, iterations)
    schedule.entered.clear()


async def execute_frame(frame: state.Frame) -> Any:
    """Run a (sub-)flow to the end; return the output, raise Paused or RunStopped.

    A ready queue (:class:`_Schedule`): a node starts once each predecessor has settled, or is
    skipped when no edge into it was taken (dead-path elimination).

    Each node runs in a task of its own, so that nodes run concurrently; a transform or a
    branch that starts alone (nothing else ready or running: a chain, a loop) runs in this
    task instead, after one pass of the event loop, as it would have in a task of its own. A
    task and the wait for it cost three passes of the loop, a third of such a node's time.
    """
    graph_nodes = frame.compiled.nodes
    schedule = _Schedule(frame)
    ready = schedule.ready
    running: dict[asyncio.Task[Phase], str] = {}
    waiting = False
    try:
        while ready or running:
            await _fold(frame, schedule)
            alone: graph.CompiledNode | None = None
            while ready:
                node_id = ready.pop(0)
                node = graph_nodes[node_id]
                if node.predecessors and not any(
                    _taken(frame, p, node_id) for p in node.predecessors
                ):
                    await _skip(frame, node)
                    schedule.settle(node_id)
                    continue
                if not ready and not running and node.kind in lifecycle.CHEAP_KINDS:
                    alone = node
                    break
                running[asyncio.create_task(_execute_node(frame, node))] = node_id
            if alone is not None:
                await asyncio.sleep(0)  # the pass a task would have waited for
                if await _execute_node(frame, alone) == Phase.WAITING:
                    waiting = True
                else:
                    schedule.settle(alone.id)
                continue
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node_id = running.pop(task)
                if task.result() == Phase.WAITING:
                    waiting = True
                else:
                    schedule.settle(node_id)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    if waiting:
        raise state.Paused()
    return await _output(frame)


async def _skip(frame: state.Frame, node: graph.CompiledNode) -> None:
    key = frame.key(node.id)
    status = flowrun_api.NodeStatus(phase=Phase.SKIPPED, finished_at=frame.run.timestamp())
    await frame.run.save_node(key, status)
    frame.run.emit("skipped", key, node.kind, status)


async def _execute_node(frame: state.Frame, node: graph.CompiledNode) -> Phase:
    """Execute one node through the record lifecycle; a failed node stops the run."""
    key = frame.key(node.id)
    body = functools.partial(nodes.dispatch, frame, node, key)
    retry = node.spec.retry or frame.compiled.spec.node_retry
    try:
        phase = await lifecycle.execute(frame.run, key, node.kind, body, retry)
    except state.NodeFailed as exc:
        raise state.RunStopped(exc.reason, f'node "{key}" failed: {exc}') from exc
    if phase == Phase.SUCCEEDED:
        iteration = frame.iteration(node.id) if node.loop else None
        frame.scope.add(node.id, frame.run.checkpoint.nodes[key].output, iteration)
    return phase


async def _output(frame: state.Frame) -> Any:
    """The (sub-)flow output: the output expression, else the finished sinks' json."""
    if frame.compiled.output is not None:
        try:
            return await expressions.evaluate_async(frame.compiled.output, frame.scope.scope())
        except expressions.ExpressionError as exc:
            raise state.RunStopped(Reason.OUTPUT_FAILED, f"spec.output: {exc}") from exc
    outputs = frame.scope.outputs
    sinks = [s for s in frame.compiled.sinks if s in outputs]
    if len(sinks) == 1:
        return (outputs[sinks[0]] or {}).get("json")
    return {s: (outputs[s] or {}).get("json") for s in sinks}


def input_problems(schema: Any, value: Any) -> list[str]:
    """Why ``value`` does not match the Flow's input ``schema``, one ``input.<path>: ...`` each."""
    if schema is None:
        return []
    problems = []
    for found in schemas.mismatches(schema, value):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in found.path)
        where = "spec.input (the schema)" if found.bad_schema else f"input{path}"
        problems.append(f"{where}: {found.message}")
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
    observer: state.Observer | None = None,
    now: times.Clock = times.now,
    ceilings: tuple[state.Cap, ...] = (),
) -> store.Outcome:
    """Run (or resume) a flow to its end or its next pause, and return the outcome.

    A run whose store already holds a terminal outcome is returned as it is. The stored input
    wins over ``input_value`` on resume, so a resumed run sees what it started with. ``now``
    is the host's clock: request expiry and the run deadline are measured with it. ``ceilings``
    are the host's ceilings on the run's total usage besides the Flow's limits (a namespace
    budget), enforced as limits.maxTokens and maxCostUSD are.
    """
    checkpoint = await store_.load()
    if checkpoint.outcome is not None and checkpoint.outcome.phase.terminal:
        return checkpoint.outcome
    run = state.Run(
        run_name,
        compiled.spec,
        store_,
        caps,
        resolver,
        checkpoint,
        execute_frame,
        clock=now,
        observer=observer,
        usage=total_usage(checkpoint),
        executions=sum(r.attempts for r in checkpoint.nodes.values()),
        ceilings=ceilings,
    )
    if checkpoint.run is None:
        checkpoint.run = store.RunRecord(run_name, input_value, trigger, run.timestamp())
        await store_.save_run(checkpoint.run)
    started = times.parse_time(checkpoint.run.started_at) or run.clock()
    with spans.span(f"run {run_name}", {"agentflows.run.name": run_name}) as span:
        outcome = await _run_with_limits(run, compiled, checkpoint.run.input, started)
        outcome.usage = run.usage
        span.set(_outcome_attributes(outcome))
        if outcome.phase is flowrun_api.RunPhase.FAILED:
            span.fail(outcome.message or outcome.phase.value)
    await store_.save_outcome(outcome)
    return outcome


async def _run_with_limits(
    run: state.Run, compiled: graph.CompiledFlow, value: Any, started: dt.datetime
) -> store.Outcome:
    problems = input_problems(compiled.spec.input, value)
    if problems:
        return _failed(run, Reason.INVALID_INPUT, "invalid input: " + "; ".join(problems))
    timeout = compiled.spec.limits.timeout_seconds
    remaining = None if timeout is None else timeout - (run.clock() - started).total_seconds()
    # expressions are bounded by the same deadline (a looping jq program blocks no timer)
    run.deadline = None if remaining is None else time.monotonic() + remaining
    try:
        if remaining is not None and remaining <= 0:
            raise TimeoutError
        async with asyncio.timeout(remaining):
            output = await execute_frame(state.Frame(run, compiled, "", 0, value))
    except state.Paused:
        return store.Outcome(
            flowrun_api.RunPhase.WAITING, reason=Reason.WAITING, message=_waiting_message(run)
        )
    except state.RunStopped as exc:
        return _failed(run, exc.reason, exc.message)
    except TimeoutError:
        return _failed(
            run,
            Reason.TIMEOUT,
            f"run exceeded limits.timeoutSeconds={timeout} (started {times.timestamp(started)})",
        )
    return store.Outcome(
        flowrun_api.RunPhase.SUCCEEDED,
        output=output,
        reason=Reason.SUCCEEDED,
        completed_at=run.timestamp(),
    )


def _outcome_attributes(outcome: store.Outcome) -> spans.Attributes:
    return {
        "agentflows.run.phase": outcome.phase.value,
        "agentflows.run.reason": str(outcome.reason or ""),
        "gen_ai.usage.input_tokens": outcome.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": outcome.usage.completion_tokens,
        "agentflows.usage.cost_usd": outcome.usage.cost_usd,
    }


def _failed(run: state.Run, reason: Reason, message: str) -> store.Outcome:
    return store.Outcome(
        flowrun_api.RunPhase.FAILED, message=message, reason=reason, completed_at=run.timestamp()
    )


def _waiting_message(run: state.Run) -> str:
    pending = human_requests.pending_in(run.checkpoint.requests, run.checkpoint.nodes)
    return (
        "waiting for " + ", ".join(f'request "{rid}"' for rid in pending) if pending else "waiting"
    )
