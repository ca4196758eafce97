"""Node kinds, and the record lifecycle around them (Running -> Succeeded | Failed | Waiting).

How each of agent, llm, tool, transform, branch, map, approval, input and flow executes.

Executing a node is idempotent given the store: a paused node looks up its request and goes on
only once the request carries a decision; a map re-runs only the items without a finished
record; a sub-flow re-runs only its unfinished nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

from agentflows.api import agent as agent_api
from agentflows.api import common, schemas
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, envelope, expressions
from agentflows.engine import run as run_mod

if TYPE_CHECKING:
    from agentflows.engine import graph

Phase = flowrun_api.NodePhase
#: Who "decides" an expired request, recorded in decidedBy.
TIMEOUT_DECIDER = "agentflows:timeout"


@dataclasses.dataclass
class _Waiting:
    """A node result meaning: a request is pending; persist it and stop this path."""

    request_id: str
    state: Any = None
    usage: common.Usage | None = None
    detail: Any = None


class _NodeFailed(Exception):
    def __init__(self, message: str, *, reason: str = "NodeFailed") -> None:
        super().__init__(message)
        self.reason = reason


Result = capabilities.NodeResult | _Waiting


async def execute(execution: run_mod._Execution, node: graph.CompiledNode) -> Phase:
    """Execute one node with its record lifecycle; return the phase it ended in."""
    run = execution.run
    key = execution.key(node.id)
    previous = run.checkpoint.nodes.get(key)
    run.count_execution()
    record = flowrun_api.NodeStatus(
        phase=Phase.RUNNING,
        started_at=previous.started_at if previous and previous.started_at else run_mod.timestamp(),
        attempts=(previous.attempts if previous else 0) + 1,
        detail=previous.detail if previous else None,
    )
    if node.kind not in ("transform", "branch"):
        # cheap nodes skip the Running write: a re-run costs nothing and saves a store write
        await run.save_node(key, record)
    run.emit("started", key, node.kind, record)
    try:
        result = await _dispatch(execution, node, key, previous)
    except (capabilities.CapabilityError, _NodeFailed, expressions.ExpressionError) as exc:
        reason = getattr(exc, "reason", "NodeFailed")
        failed = record.model_copy(
            update={
                "phase": Phase.FAILED,
                "error": str(exc)[:32768],
                "finished_at": run_mod.timestamp(),
            }
        )
        await run.save_node(key, failed)
        run.emit("failed", key, node.kind, failed)
        raise run_mod.RunStopped(reason, f'node "{key}" failed: {exc}') from exc
    except run_mod._Paused:
        run.emit("waiting", key, node.kind, record)
        return Phase.WAITING
    if isinstance(result, _Waiting):
        waiting = record.model_copy(
            update={
                "phase": Phase.WAITING,
                "usage": result.usage,
                "detail": {
                    "request": result.request_id,
                    "state": result.state,
                    "record": result.detail,
                },
            }
        )
        await run.save_node(key, waiting)
        run.add_usage(result.usage)
        run.emit("waiting", key, node.kind, waiting)
        return Phase.WAITING
    # a turn resumed after a pause: its record keeps the whole turn's usage (the part before
    # the pause is already in the run total, so only result.usage is added to that below)
    whole = result.usage
    if previous is not None and previous.phase == Phase.WAITING and previous.usage is not None:
        whole = previous.usage.add(result.usage)
    done = record.model_copy(
        update={
            "phase": Phase.SUCCEEDED,
            "output": result.output,
            "usage": whole if _has_usage(whole) else None,
            "detail": result.detail,
            "finished_at": run_mod.timestamp(),
        }
    )
    await run.save_node(key, done)
    execution.scope.add(node.id, result.output)
    run.emit("succeeded", key, node.kind, done)
    run.add_usage(result.usage)
    return Phase.SUCCEEDED


def _has_usage(usage: common.Usage) -> bool:
    return usage != common.Usage()


async def _dispatch(
    execution: run_mod._Execution,
    node: graph.CompiledNode,
    key: str,
    previous: flowrun_api.NodeStatus | None,
) -> Result:
    spec = node.spec
    scope = execution.scope.scope()
    t = node.templates
    if spec.transform is not None:
        return capabilities.NodeResult(
            envelope.from_value(expressions.evaluate(t["transform"], scope))
        )
    if spec.branch is not None:
        return _branch(spec.branch, expressions.evaluate(t["value"], scope))
    if spec.approval is not None:
        return await _human(execution, key, previous, node, scope)
    if spec.input is not None:
        return await _human(execution, key, previous, node, scope)
    if spec.map is not None:
        return await _map(execution, node, key, scope)
    if spec.flow is not None:
        value = expressions.evaluate(t["input"], scope)
        output = await _subflow(execution, spec.flow.name, value, f"{key}/")
        return capabilities.NodeResult(envelope.from_value(output))
    resume = _resume_of(execution, previous)
    ctx = execution.run.context(key, execution.depth, resume)
    if spec.agent is not None:
        return await _agent(execution, spec.agent, expressions.evaluate(t["prompt"], scope), ctx)
    if spec.llm is not None:
        task = capabilities.LlmTask(
            model=spec.llm.model,
            system=str(expressions.evaluate(t["system"], scope) or ""),
            prompt=str(expressions.evaluate(t["prompt"], scope)),
            output_schema=spec.llm.output_schema,
        )
        return await execution.run.caps.complete(task, ctx)
    assert spec.tool is not None
    return await _tool(execution, spec.tool, expressions.evaluate(t["args"], scope), ctx)


def _branch(spec: flow_api.Branch, value: Any) -> capabilities.NodeResult:
    case = expressions.case_key(value)
    chosen: str = case if case in spec.cases else "default"
    target = spec.cases.get(case, spec.default)
    return capabilities.NodeResult(
        envelope.from_value({"value": value, "case": chosen, "next": target})
    )


def _resume_of(
    execution: run_mod._Execution, previous: flowrun_api.NodeStatus | None
) -> capabilities.Resume | None:
    if previous is None or previous.phase != Phase.WAITING or not isinstance(previous.detail, dict):
        return None
    request = execution.run.checkpoint.requests.get(str(previous.detail.get("request")))
    if request is None or request.decision is None:
        return None
    return capabilities.Resume(state=previous.detail.get("state"), request=request)


def _pending_request(
    execution: run_mod._Execution, previous: flowrun_api.NodeStatus | None
) -> str | None:
    """The id of this node's undecided request, if it is waiting on one."""
    if previous is None or previous.phase != Phase.WAITING or not isinstance(previous.detail, dict):
        return None
    request_id = str(previous.detail.get("request"))
    request = execution.run.checkpoint.requests.get(request_id)
    return request_id if request is not None and request.decision is None else None


def _new_request_id(execution: run_mod._Execution, key: str) -> str:
    requests = execution.run.checkpoint.requests
    if key not in requests:
        return key
    n = 2
    while f"{key}-{n}" in requests:
        n += 1
    return f"{key}-{n}"


async def _persist_request(
    execution: run_mod._Execution, key: str, request: flowrun_api.HumanRequest
) -> str:
    request_id = _new_request_id(execution, key)
    if request.requested_at is None:
        request = request.model_copy(update={"requested_at": run_mod.timestamp()})
    await execution.run.save_request(request_id, request)
    return request_id


async def _human(
    execution: run_mod._Execution,
    key: str,
    previous: flowrun_api.NodeStatus | None,
    node: graph.CompiledNode,
    scope: expressions.Scope,
) -> Result:
    """Approval and input nodes: ask once, then wait until decided or expired."""
    gate = node.spec.approval or node.spec.input
    assert gate is not None
    is_input = node.spec.input is not None
    pending = _pending_request(execution, previous)
    if pending is not None:
        request = execution.run.checkpoint.requests[pending]
        if request.expires_at and run_mod.now() >= run_mod.parse_time(request.expires_at):
            return _unless_unrouted_rejection(execution, node, _expired(pending, request, is_input))
        return _Waiting(pending)
    resume = _resume_of(execution, previous)
    if resume is not None:
        result = _decided(resume.request, node.spec, is_input)
        return _unless_unrouted_rejection(execution, node, result)
    expires = None
    if gate.timeout_seconds is not None:
        expires = run_mod.timestamp(run_mod.now() + dt.timedelta(seconds=gate.timeout_seconds))
    request = flowrun_api.HumanRequest(
        node=key,
        kind=flowrun_api.RequestKind.INPUT if is_input else flowrun_api.RequestKind.APPROVAL,
        message=str(expressions.evaluate(node.templates["message"], scope) or ""),
        summary=str(expressions.evaluate(node.templates["summary"], scope) or "")
        if "summary" in node.templates
        else "",
        schema_=node.spec.input.schema_ if node.spec.input is not None else None,
        approvers=gate.approvers,
        expires_at=expires,
        on_timeout=gate.on_timeout.value,
    )
    return _Waiting(await _persist_request(execution, key, request))


def _unless_unrouted_rejection(
    execution: run_mod._Execution, node: graph.CompiledNode, result: Result
) -> Result:
    """A rejected approval with no branch after it ends the run: Failed, reason Rejected.

    Failed rather than Succeeded because whatever waits for the run to succeed (kubectl wait,
    a pipeline, an alert) must not take "a human said no" for "the work was done". A flow that
    expects rejections routes them with a branch on ``.nodes.<id>.json.decision``.
    """
    if node.kind != "approval" or not isinstance(result, capabilities.NodeResult):
        return result
    decision = (result.output.get("json") or {}).get("decision")
    if decision != flowrun_api.Decision.REJECT.value:
        return result
    successors = execution.compiled.nodes[node.id].successors
    if any(execution.compiled.nodes[s].kind == "branch" for s in successors):
        return result
    data = result.output["json"]
    comment = f": {data['comment']}" if data.get("comment") else ""
    raise _NodeFailed(f"rejected by {data.get('decidedBy')}{comment}", reason="Rejected")


def _expired(request_id: str, request: flowrun_api.HumanRequest, is_input: bool) -> Result:
    if request.on_timeout == flow_api.OnTimeout.FAIL.value or (
        is_input and request.on_timeout != "reject"
    ):
        raise _NodeFailed(
            f'request "{request_id}" expired at {request.expires_at}', reason="RequestExpired"
        )
    decided = request.model_copy(
        update={
            "decision": flowrun_api.Decision.REJECT,
            "comment": f"expired at {request.expires_at}",
            "decided_by": TIMEOUT_DECIDER,
            "decided_at": run_mod.timestamp(),
        }
    )
    return capabilities.NodeResult(envelope.from_value(_decision_json(decided)))


def _decision_json(request: flowrun_api.HumanRequest) -> dict[str, Any]:
    return {
        "decision": request.decision.value if request.decision else None,
        "comment": request.comment,
        "edits": request.edits,
        "data": request.data,
        "decidedBy": request.decided_by,
        "decidedAt": request.decided_at,
    }


def _decided(
    request: flowrun_api.HumanRequest, spec: flow_api.Node, is_input: bool
) -> capabilities.NodeResult:
    if is_input:
        assert spec.input is not None
        if request.decision == flowrun_api.Decision.REJECT:
            raise _NodeFailed(f"input request rejected by {request.decided_by}", reason="Rejected")
        if spec.input.schema_ is not None:
            errors = list(schemas.validator(spec.input.schema_).iter_errors(request.data))
            if errors:
                raise _NodeFailed(f"input does not match the schema: {errors[0].message}")
        return capabilities.NodeResult(envelope.from_value(request.data))
    return capabilities.NodeResult(envelope.from_value(_decision_json(request)))


async def _agent(
    execution: run_mod._Execution,
    call: flow_api.AgentCall,
    prompt: Any,
    ctx: capabilities.NodeContext,
) -> Result:
    spec = execution.run.resolver.agent(call.name)
    if spec is None:
        raise _NodeFailed(f'no Agent "{call.name}"')
    task = capabilities.AgentTask(call.name, spec, str(prompt))
    pending = _pending_request(execution, execution.run.checkpoint.nodes.get(ctx.node_key))
    if pending is not None:
        return _Waiting(pending, execution.run.checkpoint.nodes[ctx.node_key].detail.get("state"))
    result = await execution.run.caps.run_agent(task, ctx)
    return await _from_capability(execution, ctx.node_key, result)


async def _from_capability(
    execution: run_mod._Execution,
    key: str,
    result: capabilities.NodeResult | capabilities.Pause,
) -> Result:
    if isinstance(result, capabilities.Pause):
        request_id = await _persist_request(execution, key, result.request)
        return _Waiting(request_id, result.state, result.usage, result.detail)
    return result


def _tool_task(
    execution: run_mod._Execution, call: flow_api.ToolCall, args: Any, node_id: str
) -> capabilities.ToolTask:
    if call.http is not None:
        return capabilities.ToolTask(
            agent_api.Tool(name=_tool_id(node_id), http=call.http), node_id, args
        )
    if call.python is not None:
        return capabilities.ToolTask(
            agent_api.Tool(name=_tool_id(node_id), python=call.python), node_id, args
        )
    assert call.agent is not None and call.name is not None
    spec = execution.run.resolver.agent(call.agent)
    if spec is None:
        raise _NodeFailed(f'no Agent "{call.agent}"')
    for tool in spec.tools:
        if tool.name == call.name:
            return capabilities.ToolTask(tool, call.name, args)
    for tool in spec.tools:
        if tool.mcp is not None and (not tool.mcp.include or call.name in tool.mcp.include):
            return capabilities.ToolTask(tool, call.name, args)
    raise _NodeFailed(f'no tool "{call.name}" in Agent "{call.agent}"')


def _tool_id(node_id: str) -> str:
    return (
        node_id.replace("[", "-").replace("]", "").replace("/", "-").lower()[:63].strip("-_")
        or "tool"
    )


async def _tool(
    execution: run_mod._Execution, call: flow_api.ToolCall, args: Any, ctx: capabilities.NodeContext
) -> Result:
    pending = _pending_request(execution, execution.run.checkpoint.nodes.get(ctx.node_key))
    if pending is not None:
        return _Waiting(pending, execution.run.checkpoint.nodes[ctx.node_key].detail.get("state"))
    task = _tool_task(execution, call, args, ctx.node_key.rsplit("/", 1)[-1])
    result = await execution.run.caps.call_tool(task, ctx)
    return await _from_capability(execution, ctx.node_key, result)


async def _subflow(execution: run_mod._Execution, name: str, value: Any, prefix: str) -> Any:
    try:
        compiled = execution.run.compile_subflow(name, execution.depth + 1)
    except capabilities.CapabilityError as exc:
        raise _NodeFailed(str(exc)) from exc
    sub = run_mod._Execution(execution.run, compiled, prefix, execution.depth + 1, value)
    return await sub.execute()


async def _map(
    execution: run_mod._Execution, node: graph.CompiledNode, key: str, scope: expressions.Scope
) -> Result:
    """Run the body once per item (bounded concurrency); merge results in item order."""
    spec = node.spec.map
    assert spec is not None
    items = expressions.evaluate(node.templates["items"], scope)
    if items is None:
        items = []
    if not isinstance(items, list):
        raise _NodeFailed(f"map.items must give a list, got {type(items).__name__}")
    if len(items) > spec.max_items:
        raise _NodeFailed(f"map.items gave {len(items)} items, over map.maxItems={spec.max_items}")
    run = execution.run
    limit = asyncio.Semaphore(spec.concurrency)
    results: list[Any] = [None] * len(items)
    paused = False

    async def one(index: int, item: Any) -> None:
        nonlocal paused
        item_key = f"{key}[{index}]"
        previous = run.checkpoint.nodes.get(item_key)
        if previous is not None and previous.phase == Phase.SUCCEEDED:
            results[index] = previous.output
            return
        async with limit:
            item_scope = execution.scope.scope(item=item, items=items)
            run.count_execution()
            record = flowrun_api.NodeStatus(
                phase=Phase.RUNNING,
                started_at=run_mod.timestamp(),
                attempts=(previous.attempts if previous else 0) + 1,
                detail=previous.detail if previous else None,
            )
            await run.save_node(item_key, record)
            try:
                result = await _map_body(execution, node, spec, item_key, item_scope, previous)
            except (capabilities.CapabilityError, _NodeFailed, expressions.ExpressionError) as exc:
                failed = record.model_copy(
                    update={
                        "phase": Phase.FAILED,
                        "error": str(exc)[:32768],
                        "finished_at": run_mod.timestamp(),
                    }
                )
                await run.save_node(item_key, failed)
                raise _NodeFailed(f"item {index}: {exc}") from exc
            except run_mod._Paused:
                paused = True
                return
            if isinstance(result, _Waiting):
                paused = True
                await run.save_node(
                    item_key,
                    record.model_copy(
                        update={
                            "phase": Phase.WAITING,
                            "usage": result.usage,
                            "detail": {"request": result.request_id, "state": result.state},
                        }
                    ),
                )
                return
            done = record.model_copy(
                update={
                    "phase": Phase.SUCCEEDED,
                    "output": result.output,
                    "usage": result.usage if _has_usage(result.usage) else None,
                    "detail": result.detail,
                    "finished_at": run_mod.timestamp(),
                }
            )
            await run.save_node(item_key, done)
            run.add_usage(result.usage)
            results[index] = result.output

    await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    if paused:
        raise run_mod._Paused()
    output = envelope.from_value([(r or {}).get("json") for r in results])
    output["items"] = results
    return capabilities.NodeResult(output)


async def _map_body(
    execution: run_mod._Execution,
    node: graph.CompiledNode,
    spec: flow_api.MapNode,
    item_key: str,
    scope: expressions.Scope,
    previous: flowrun_api.NodeStatus | None,
) -> Result:
    t = node.templates
    if spec.flow is not None:
        value = expressions.evaluate(t["input"], scope)
        return capabilities.NodeResult(
            envelope.from_value(await _subflow(execution, spec.flow.name, value, f"{item_key}/"))
        )
    ctx = execution.run.context(item_key, execution.depth, _resume_of(execution, previous))
    if spec.agent is not None:
        return await _agent(execution, spec.agent, expressions.evaluate(t["prompt"], scope), ctx)
    assert spec.tool is not None
    return await _tool(execution, spec.tool, expressions.evaluate(t["args"], scope), ctx)
