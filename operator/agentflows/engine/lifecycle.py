"""The node-record lifecycle: the one place a node's record is written.

::

    (none | Waiting | Running) --> Running --> Succeeded | Failed | Waiting
                                     ^  |
                                     +--+  a temporary failure the node's retry policy covers

Plain nodes, map items and the nodes of sub-flows all go through :func:`execute`: it counts
the execution against limits.maxNodeExecutions, writes the record, retries temporary failures
with backoff and jitter (keeping the earlier attempts' errors on the record), adds usage to the
run's total and checks the token and cost limits, tells the observer, and opens a span per try
(:mod:`agentflows.engine.spans`). A node kind only
computes a result (:mod:`agentflows.engine.nodes`).

A record keeps what its node did over all its executions: the start of the first, the attempt
count, the errors of earlier attempts (an attempt stopped with its run — a runner's SIGTERM —
leaves :data:`INTERRUPTED` there), and the usage of the turns before a pause (which the run's
total already holds, so only the new part is added to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NoReturn

from agentflows.api import common
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import retry as retry_policy
from agentflows.engine import capabilities, expressions, spans, state

Phase = flowrun_api.NodePhase
#: A node kind bound to its node: given the node's previous record, compute its result.
Body = Callable[[flowrun_api.NodeStatus | None], Awaitable[state.Result]]
#: Errors that fail a node (anything else is a bug, or a stop of the whole run).
NODE_ERRORS = (capabilities.CapabilityError, state.NodeFailed, expressions.ExpressionError)
_NO_USAGE = common.Usage()
#: Kinds that run in microseconds: a re-run costs nothing, so their Running record is not saved
#: (and the run loop executes one that starts alone without a task of its own).
CHEAP_KINDS = ("transform", "branch")
#: The attempt error of a node whose run was stopped while it ran.
INTERRUPTED = "interrupted: the run stopped while the node ran; the next attempt runs it again"


async def execute(
    run: state.Run, key: str, kind: str, body: Body, retry: flow_api.NodeRetry
) -> Phase:
    """Execute one node with its record lifecycle; return Succeeded or Waiting.

    Raise :class:`state.NodeFailed` (the record says Failed) when the node fails for good, and
    :class:`state.RunStopped` when a limit is hit.
    """
    previous = run.checkpoint.nodes.get(key)
    carried = _carried_usage(previous)
    record = flowrun_api.NodeStatus(
        phase=Phase.RUNNING,
        started_at=previous.started_at if previous and previous.started_at else run.timestamp(),
        attempts=(previous.attempts if previous else 0) + 1,
        attempt_errors=previous.attempt_errors if previous else [],
        usage=carried if _has_usage(carried) else None,
        detail=previous.detail if previous else None,
    )
    tries = 0
    while True:
        tries += 1
        run.count_execution()
        if tries > 1:
            record = record.model_copy(update={"attempts": record.attempts + 1})
        if kind not in CHEAP_KINDS:
            await run.save_node(key, record)
        run.emit("started" if tries == 1 else "retrying", key, kind, record)
        with spans.span(f"node {key}", _span_attributes(run, key, kind, record)) as span:
            try:
                result = await body(previous)
            except state.Paused:
                span.set({"agentflows.node.phase": Phase.WAITING.value})
                run.emit("waiting", key, kind, record)
                return Phase.WAITING
            except asyncio.CancelledError:
                # The run is being stopped (its runner got SIGTERM, Ctrl-C): the record, still
                # Running, says so; the stopping runner writes it before it exits, and the next
                # attempt runs the node again. It adds to the latest saved record, which holds
                # the progress the node kept (an agent turn's handoff), not to the one it began.
                latest = run.checkpoint.nodes.get(key, record)
                await run.save_node(key, _with_attempt_error(latest, INTERRUPTED))
                raise
            except NODE_ERRORS as exc:
                span.fail(str(exc))
                failure = exc
            else:
                phase = await _finish(run, key, kind, record, carried, result)
                span.set({"agentflows.node.phase": phase.value})
                return phase
        if not _retries(failure, retry, tries):
            await _fail(run, key, kind, record, failure)
        record = _with_attempt_error(record, failure)
        await asyncio.sleep(backoff(retry, tries))


def _span_attributes(
    run: state.Run, key: str, kind: str, record: flowrun_api.NodeStatus
) -> spans.Attributes:
    return {
        "agentflows.run.name": run.name,
        "agentflows.node.key": key,
        "agentflows.node.kind": kind,
        "agentflows.node.attempt": record.attempts,
    }


async def _fail(
    run: state.Run, key: str, kind: str, record: flowrun_api.NodeStatus, exc: Exception
) -> NoReturn:
    failed = record.model_copy(
        update={"phase": Phase.FAILED, "error": str(exc)[:32768], "finished_at": run.timestamp()}
    )
    await run.save_node(key, failed)
    run.emit("failed", key, kind, failed)
    reason = exc.reason if isinstance(exc, state.NodeFailed) else state.Reason.NODE_FAILED
    raise state.NodeFailed(str(exc), reason=reason) from exc


async def _finish(
    run: state.Run,
    key: str,
    kind: str,
    record: flowrun_api.NodeStatus,
    carried: common.Usage,
    result: state.Result,
) -> Phase:
    whole = carried.add(result.usage) if _has_usage(carried) else result.usage
    update: dict[str, object] = {"usage": whole if _has_usage(whole) else None}
    if isinstance(result, state.Waiting):
        phase = Phase.WAITING
        update["detail"] = {
            "request": result.request_id,
            "state": result.state,
            "record": result.detail,
        }
    else:
        phase = Phase.SUCCEEDED
        update |= {"output": result.output, "detail": result.detail}
        update["finished_at"] = run.timestamp()
    done = record.model_copy(update={"phase": phase, **update})
    await run.save_node(key, done)
    run.emit(phase.value.lower(), key, kind, done)
    if _has_usage(result.usage):
        run.add_usage(result.usage)
    return phase


def _retries(exc: Exception, retry: flow_api.NodeRetry, tries: int) -> bool:
    """True when ``exc`` is temporary, the policy covers its source, and attempts are left."""
    return (
        tries < retry.max_attempts
        and isinstance(exc, capabilities.CapabilityError)
        and exc.retryable
        and exc.source in retry.retry_on
    )


def backoff(retry: flow_api.NodeRetry, tries: int) -> float:
    """Seconds to wait after failed try number ``tries``: doubling, capped, with jitter."""
    policy = retry_policy.Backoff(
        initial=retry.backoff_seconds, cap=retry.max_backoff_seconds, jitter=retry.jitter
    )
    return policy.delay(tries)


def _with_attempt_error(
    record: flowrun_api.NodeStatus, error: Exception | str
) -> flowrun_api.NodeStatus:
    text = f"attempt {record.attempts}: {error}"[: flowrun_api.MAX_ATTEMPT_ERROR_CHARS]
    errors = [*record.attempt_errors, text][-flowrun_api.MAX_ATTEMPT_ERRORS :]
    return record.model_copy(update={"attempt_errors": errors})


def _carried_usage(previous: flowrun_api.NodeStatus | None) -> common.Usage:
    """Usage of earlier executions still part of this node's work (turns before a pause)."""
    if previous is None or previous.usage is None:
        return _NO_USAGE
    if previous.phase in (Phase.WAITING, Phase.RUNNING):
        return previous.usage
    return _NO_USAGE


def _has_usage(usage: common.Usage) -> bool:
    # Every counter is >= 0, so "not all zero" is "not equal to Usage()"; read as fields, it
    # costs a fraction of the model's __eq__, and it runs four times per node.
    return usage is not _NO_USAGE and bool(
        usage.prompt_tokens
        or usage.completion_tokens
        or usage.cost_usd
        or usage.llm_calls
        or usage.tool_calls
    )
