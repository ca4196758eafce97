"""Node kinds: what each of agent, llm, tool, transform, branch, map, approval, input, flow does.

The run loop calls :func:`dispatch`; the record around it (Running ->
Succeeded | Failed | Waiting, usage, limits, events, retries) is
:mod:`agentflows.engine.lifecycle`'s, for map items too.

Executing a node is idempotent given the store: a paused node looks up its request and goes on
only once the request carries a decision; a map re-runs only the items without a finished
record; a sub-flow re-runs only its unfinished nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import json
import re
from typing import Any

import pydantic

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import schemas, times
from agentflows.engine import capabilities, envelope, expressions, graph, lifecycle, state

Phase = flowrun_api.NodePhase
Reason = flowrun_api.RunReason
#: Who "decides" an expired request, recorded in decidedBy.
TIMEOUT_DECIDER = "agentflows:timeout"
_ITEMS_WORD = re.compile(r"\bitems\b")
#: Kinds that never record anything beneath their own record (no map items ``<key>[i]``, no
#: sub-flow steps ``<key>/...``): no capability gets their key (:func:`dispatch`).
LEAF_KINDS = frozenset({"transform", "branch", "approval", "input"})


async def dispatch(
    frame: state.Frame,
    node: graph.CompiledNode,
    key: str,
    previous: flowrun_api.NodeStatus | None,
    *,
    args: dict[str, Any] | None = None,
) -> state.Result:
    """Compute ``node``'s result; ``previous`` is its record from an earlier execution.

    ``args`` are an agent's arguments when the node runs as its tool: merged into a tool's
    ``args`` or a flow's ``input``, replacing an llm's or agent's ``prompt``/``system``, and
    visible to every expression of the node as ``.args``. They are values, never expressions.
    """
    spec = node.spec
    scope = frame.scope.scope() if args is None else frame.scope.scope(args=args)
    t = node.templates
    if spec.transform is not None:
        return capabilities.NodeResult(
            envelope.from_value(await expressions.evaluate_async(t["transform"], scope))
        )
    if spec.branch is not None:
        return _branch(spec.branch, await expressions.evaluate_async(t["value"], scope))
    if spec.approval is not None:
        return await _human(frame, key, previous, node, scope)
    if spec.input is not None:
        return await _human(frame, key, previous, node, scope)
    if spec.map is not None:
        return await _map(frame, node, key, scope)
    if spec.flow is not None:
        value = _merged(await expressions.evaluate_async(t["input"], scope), args)
        output = await _subflow(frame, spec.flow, value, f"{key}/")
        return capabilities.NodeResult(envelope.from_value(output))
    resume = _resume_of(frame, previous)
    ctx = frame.run.context(key, frame.depth, resume, _progress_of(previous))
    if spec.agent is not None:
        return await _agent(frame, spec.agent, node, scope, ctx, previous, args)
    if spec.llm is not None:
        task = capabilities.LlmTask(
            model=spec.llm.model,
            system=str(await _filled(args, "system", t, scope) or ""),
            prompt=str(await _filled(args, "prompt", t, scope)),
            output_schema=spec.llm.output_schema,
        )
        return await frame.run.caps.complete(task, ctx)
    assert spec.tool is not None
    tool_args = _merged(await expressions.evaluate_async(t["args"], scope), args)
    return await _tool(frame, spec.tool, tool_args, ctx, previous, args is None)


async def _filled(
    args: dict[str, Any] | None,
    field: str,
    templates: dict[str, expressions.Template],
    scope: expressions.Scope,
) -> Any:
    """An agent's argument for ``field`` when it gave one, else the configured template's value."""
    if args is not None and field in args:
        return args[field]
    return await expressions.evaluate_async(templates[field], scope)


def _merged(value: Any, args: dict[str, Any] | None) -> Any:
    """``value`` (a tool's args, a flow's input) with an agent's arguments merged over it."""
    if not args:
        return value
    if value is None:
        return dict(args)
    if not isinstance(value, dict):
        raise state.NodeFailed(
            f"its configured value is a {type(value).__name__}, so the agent's arguments "
            f"({', '.join(args)}) cannot be merged into it"
        )
    return {**value, **args}


async def run_node_tool(
    frame: state.Frame, node_id: str, args: dict[str, Any], ctx: capabilities.NodeContext
) -> dict[str, Any]:
    """Run tool node ``node_id`` once for an agent's call; return its output envelope.

    The node goes through the same lifecycle as any other (its record is stored under the
    calling tool call's key, ``<agent node>/<call id>/<node>``, with usage and limits counted
    by the run). A failure is an error for the calling agent; a node that would wait for a
    human cannot, since only the agent's own turn can be saved and resumed.
    """
    node = frame.compiled.tool_nodes[node_id]
    key = f"{ctx.node_key}/{node_id}"
    body = functools.partial(dispatch, frame, node, key, args=args)
    retry = node.spec.retry or frame.compiled.spec.node_retry
    try:
        phase = await lifecycle.execute(frame.run, key, node.kind, body, retry)
    except state.NodeFailed as exc:
        raise capabilities.CapabilityError(f'node "{node_id}" failed: {exc}') from exc
    if phase == Phase.WAITING:
        raise capabilities.CapabilityError(
            f'node "{node_id}" asked for a human, which a node called as a tool cannot do'
        )
    return frame.run.checkpoint.nodes[key].output or {}


def _branch(spec: flow_api.Branch, value: Any) -> capabilities.NodeResult:
    case = expressions.case_key(value)
    chosen: str = case if case in spec.cases else "default"
    target = spec.cases.get(case, spec.default)
    return capabilities.NodeResult(
        envelope.from_value({"value": value, "case": chosen, "next": target})
    )


def _resume_of(
    frame: state.Frame, previous: flowrun_api.NodeStatus | None
) -> capabilities.Resume | None:
    if previous is None or previous.phase != Phase.WAITING or not isinstance(previous.detail, dict):
        return None
    request = frame.run.checkpoint.requests.get(str(previous.detail.get("request")))
    if request is None or request.decision is None:
        return None
    return capabilities.Resume(state=previous.detail.get("state"), request=request)


def _progress_of(previous: flowrun_api.NodeStatus | None) -> Any:
    """What an execution stopped while Running kept (``NodeContext.progress``), if anything."""
    if previous is None or previous.phase != Phase.RUNNING or not isinstance(previous.detail, dict):
        return None
    return previous.detail.get("progress")


def _pending_request(frame: state.Frame, previous: flowrun_api.NodeStatus | None) -> str | None:
    """The id of this node's undecided request, if it is waiting on one."""
    if previous is None or previous.phase != Phase.WAITING or not isinstance(previous.detail, dict):
        return None
    request_id = str(previous.detail.get("request"))
    request = frame.run.checkpoint.requests.get(request_id)
    return request_id if request is not None and request.decision is None else None


def _saved_state(previous: flowrun_api.NodeStatus | None) -> Any:
    """The state a waiting node saved with its request."""
    detail = previous.detail if previous is not None else None
    return detail.get("state") if isinstance(detail, dict) else None


def _new_request_id(frame: state.Frame, key: str) -> str:
    requests = frame.run.checkpoint.requests
    if key not in requests:
        return key
    n = 2
    while f"{key}-{n}" in requests:
        n += 1
    return f"{key}-{n}"


async def _persist_request(frame: state.Frame, key: str, request: flowrun_api.HumanRequest) -> str:
    request_id = _new_request_id(frame, key)
    if request.requested_at is None:
        request = request.model_copy(update={"requested_at": frame.run.timestamp()})
    await frame.run.save_request(request_id, request)
    return request_id


async def _human(
    frame: state.Frame,
    key: str,
    previous: flowrun_api.NodeStatus | None,
    node: graph.CompiledNode,
    scope: expressions.Scope,
) -> state.Result:
    """Approval and input nodes: ask once, then wait until decided or expired."""
    gate = node.spec.approval or node.spec.input
    assert gate is not None
    is_input = node.spec.input is not None
    pending = _pending_request(frame, previous)
    if pending is not None:
        request = frame.run.checkpoint.requests[pending]
        expiry = times.parse_time(request.expires_at)
        if expiry is not None and frame.run.clock() >= expiry:
            return _unless_unrouted_rejection(
                frame, node, _expired(frame, pending, request, is_input)
            )
        return state.Waiting(pending)
    resume = _resume_of(frame, previous)
    if resume is not None:
        result = _decided(resume.request, node.spec, is_input)
        return _unless_unrouted_rejection(frame, node, result)
    expires = None
    if gate.timeout_seconds is not None:
        expires = times.timestamp(frame.run.clock() + dt.timedelta(seconds=gate.timeout_seconds))
    request = flowrun_api.HumanRequest(
        node=key,
        kind=flowrun_api.RequestKind.INPUT if is_input else flowrun_api.RequestKind.APPROVAL,
        message=str(await expressions.evaluate_async(node.templates["message"], scope) or ""),
        summary=str(await expressions.evaluate_async(node.templates["summary"], scope) or "")
        if "summary" in node.templates
        else "",
        schema_=node.spec.input.schema_ if node.spec.input is not None else None,
        approvers=gate.approvers,
        expires_at=expires,
        on_timeout=gate.on_timeout.value,
    )
    return state.Waiting(await _persist_request(frame, key, request))


def _unless_unrouted_rejection(
    frame: state.Frame, node: graph.CompiledNode, result: state.Result
) -> state.Result:
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
    successors = frame.compiled.nodes[node.id].successors
    if any(frame.compiled.nodes[s].kind == "branch" for s in successors):
        return result
    data = result.output["json"]
    comment = f": {data['comment']}" if data.get("comment") else ""
    raise state.NodeFailed(f"rejected by {data.get('decidedBy')}{comment}", reason=Reason.REJECTED)


def _expired(
    frame: state.Frame, request_id: str, request: flowrun_api.HumanRequest, is_input: bool
) -> state.Result:
    if request.on_timeout == flow_api.OnTimeout.FAIL.value or (
        is_input and request.on_timeout != "reject"
    ):
        raise state.NodeFailed(
            f'request "{request_id}" expired at {request.expires_at}', reason=Reason.REQUEST_EXPIRED
        )
    decided = request.model_copy(
        update={
            "decision": flowrun_api.Decision.REJECT,
            "comment": f"expired at {request.expires_at}",
            "decided_by": TIMEOUT_DECIDER,
            "decided_at": frame.run.timestamp(),
        }
    )
    return capabilities.NodeResult(envelope.from_value(_decision_json(decided)))


def check_human_record(
    frame: state.Frame, node: graph.CompiledNode, record: flowrun_api.NodeStatus
) -> None:
    """Refuse to go past a Succeeded approval or input node its requests do not account for.

    The record must be what this module makes of a decided request of the node (the same
    decision, decider, time, comment, edits or data) or of one that expired. Anything else was
    written by someone other than a human deciding — a tool holding the runner's identity, say
    — and the run stops with reason HumanRecordUndecided rather than resume past the gate.
    """
    if node.kind not in ("approval", "input") or record.phase != Phase.SUCCEEDED:
        return
    key = frame.key(node.id)
    recorded = (record.output or {}).get("json") if isinstance(record.output, dict) else None
    for request in frame.run.checkpoint.requests.values():
        if request.node == key and _accounts_for(frame, node, request, recorded):
            return
    raise state.RunStopped(
        Reason.HUMAN_RECORD_UNDECIDED,
        f'node "{key}" is recorded as Succeeded, but no decided or expired request of it '
        "(status.requests) gives that result: the record was not written from a decision",
    )


def _accounts_for(
    frame: state.Frame, node: graph.CompiledNode, request: flowrun_api.HumanRequest, recorded: Any
) -> bool:
    """Whether ``recorded`` (a node record's ``json``) is what ``request`` makes of the node."""
    is_input = node.spec.input is not None
    try:
        if request.decision is not None:
            return bool(_decided(request, node.spec, is_input).output.get("json") == recorded)
        expires = times.parse_time(request.expires_at)
        if expires is None or frame.run.clock() < expires or not isinstance(recorded, dict):
            return False
        expired = _expired(frame, "", request, is_input)
    except state.NodeFailed:
        return False
    assert isinstance(expired, capabilities.NodeResult)
    made = dict(expired.output.get("json") or {})
    # decidedAt is when the engine applied the expiry, not known here
    made["decidedAt"] = recorded.get("decidedAt")
    return made == recorded


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
            raise state.NodeFailed(
                f"input request rejected by {request.decided_by}", reason=Reason.REJECTED
            )
        if spec.input.schema_ is not None:
            found = schemas.mismatch(spec.input.schema_, request.data)
            if found is not None:
                raise state.NodeFailed(
                    f"input does not match the schema at {found.where}: {found.message}"
                )
        return capabilities.NodeResult(envelope.from_value(request.data))
    return capabilities.NodeResult(envelope.from_value(_decision_json(request)))


async def _agent(
    frame: state.Frame,
    call: flow_api.AgentCall,
    node: graph.CompiledNode,
    scope: expressions.Scope,
    ctx: capabilities.NodeContext,
    previous: flowrun_api.NodeStatus | None,
    args: dict[str, Any] | None = None,
) -> state.Result:
    """An agent turn; ``args`` are a calling agent's when this node runs as its tool."""
    spec = frame.run.resolver.agent(call.name)
    if spec is None:
        raise state.NodeFailed(f'no Agent "{call.name}"')
    if "history" in node.templates:
        spec = await _with_history(spec, node.templates["history"], scope)
    prompt = await _filled(args, "prompt", node.templates, scope)
    task = capabilities.AgentTask(
        call.name,
        spec,
        str(prompt),
        session=await _memory_key(node, "session", spec.session, call.name, scope),
        request=await _memory_key(node, "request", spec.request, call.name, scope),
        memory=call.memory,
        skip_tools=call.tools is not None and call.tools.skip,
        node_tools=node.node_tools,
        files=call.files,
        answer=call.answer,
    )
    if node.node_tools:
        ctx = dataclasses.replace(ctx, run_node=functools.partial(run_node_tool, frame))
    # ``previous``, not the record now in the store: the lifecycle has already saved this
    # execution's Running record, which no longer says Waiting
    pending = _pending_request(frame, previous)
    if pending is not None:
        return state.Waiting(pending, _saved_state(previous))
    result = await frame.run.caps.run_agent(task, ctx)
    return await _from_capability(frame, ctx.node_key, result, args is None)


async def _with_history(
    spec: agent_api.AgentSpec, template: expressions.Template, scope: expressions.Scope
) -> agent_api.AgentSpec:
    """The Agent with the node's ``history`` turns after its own (a bad value fails the node)."""
    value = await expressions.evaluate_async(template, scope)
    try:
        turns = _TURNS.validate_python(value or [])
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise state.NodeFailed(
            f"agent.history: {where}: {first['msg']} (a list of {{role, content}} turns, role "
            "user, assistant or system)"
        ) from None
    return spec.model_copy(update={"history": [*spec.history, *turns]})


_TURNS = pydantic.TypeAdapter(list[agent_api.HistoryTurn])


async def _memory_key(
    node: graph.CompiledNode,
    field: str,
    agents: str | None,
    agent_name: str,
    scope: expressions.Scope,
) -> str | None:
    """The node's ``session``/``request`` (else the Agent's), evaluated; None when unset or empty.

    The Agent's is compiled here, not when the Flow is: Agents are validated on their own.
    """
    template = node.templates.get(field)
    if template is None and agents is not None:
        try:
            template = graph.memory_template(agents)
        except expressions.ExpressionError as exc:
            raise state.NodeFailed(f'Agent "{agent_name}" spec.{field}: {exc}') from None
    if template is None:
        return None
    value = await expressions.evaluate_async(template, scope)
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


async def _from_capability(
    frame: state.Frame,
    key: str,
    result: capabilities.NodeResult | capabilities.Pause,
    pausable: bool = True,
) -> state.Result:
    """The node's result; a pause persists its request, unless the node may not pause.

    A node run as an agent's tool may not: only the agent's own turn can be saved and resumed,
    so no request is left behind that nothing would ever wait for.
    """
    if isinstance(result, capabilities.Pause) and not pausable:
        raise state.NodeFailed(
            f"it needs a human's decision under autonomy {frame.run.spec.autonomy.value}, "
            "which a node called as a tool cannot wait for"
        )
    if isinstance(result, capabilities.Pause):
        request_id = await _persist_request(frame, key, result.request)
        return state.Waiting(request_id, result.state, result.usage, result.detail)
    return result


def _tool_task(
    frame: state.Frame, call: flow_api.ToolCall, args: Any, node_id: str
) -> capabilities.ToolTask:
    if call.http is not None:
        return capabilities.ToolTask(
            agent_api.Tool(name=_tool_id(node_id), http=call.http), node_id, args
        )
    if call.python is not None:
        return capabilities.ToolTask(
            agent_api.Tool(name=_tool_id(node_id), python=call.python), node_id, args
        )
    if call.mcp is not None and call.name is not None:
        tool = agent_api.Tool(name=_tool_id(node_id), mcp=call.mcp)
        return capabilities.ToolTask(tool, call.name, args)
    if call.client is not None:
        name = call.name or node_id
        return capabilities.ToolTask(
            agent_api.Tool(name=_tool_id(name), client=call.client), name, args
        )
    assert call.agent is not None and call.name is not None
    spec = frame.run.resolver.agent(call.agent)
    if spec is None:
        raise state.NodeFailed(f'no Agent "{call.agent}"')
    for tool in spec.tools:
        if tool.name == call.name:
            return capabilities.ToolTask(tool, call.name, args)
    for tool in spec.tools:
        if tool.mcp is not None and (not tool.mcp.include or call.name in tool.mcp.include):
            return capabilities.ToolTask(tool, call.name, args)
    raise state.NodeFailed(f'no tool "{call.name}" in Agent "{call.agent}"')


def _tool_id(node_id: str) -> str:
    return (
        node_id.replace("[", "-").replace("]", "").replace("/", "-").lower()[:63].strip("-_")
        or "tool"
    )


async def _tool(
    frame: state.Frame,
    call: flow_api.ToolCall,
    args: Any,
    ctx: capabilities.NodeContext,
    previous: flowrun_api.NodeStatus | None,
    pausable: bool = True,
) -> state.Result:
    pending = _pending_request(frame, previous)
    if pending is not None:
        return state.Waiting(pending, _saved_state(previous))
    # the node id: the last part of its key, without a loop iteration ("#2") or map item
    task = _tool_task(
        frame, call, args, flowrun_api.node_of_key(ctx.node_key.rsplit("/", 1)[-1])[0]
    )
    result = await frame.run.caps.call_tool(task, ctx)
    return await _from_capability(frame, ctx.node_key, result, pausable)


#: Why a sub-flow stopped that ``catchErrors`` catches: its nodes failed, not the run's limits.
CAUGHT_REASONS = frozenset(
    {Reason.NODE_FAILED, Reason.REJECTED, Reason.REQUEST_EXPIRED, Reason.OUTPUT_FAILED}
)


async def _subflow(frame: state.Frame, call: flow_api.FlowCall, value: Any, prefix: str) -> Any:
    """Run a sub-flow; with ``catchErrors`` a failure inside it is the output instead.

    A pause inside the sub-flow, a timeout and a limit are never caught: they concern the run.
    """
    try:
        try:
            compiled = frame.run.compile_subflow(call.name, frame.depth + 1)
        except capabilities.CapabilityError as exc:
            raise state.NodeFailed(str(exc)) from exc
        return await frame.run.execute_flow(
            state.Frame(frame.run, compiled, prefix, frame.depth + 1, value)
        )
    except state.NodeFailed as exc:
        if not call.catch_errors:
            raise
        return {"caughtError": str(exc)}
    except state.RunStopped as exc:
        if not call.catch_errors or exc.reason not in CAUGHT_REASONS:
            raise
        return {"caughtError": exc.message}


async def _map(
    frame: state.Frame, node: graph.CompiledNode, key: str, scope: expressions.Scope
) -> state.Result:
    """Run the body once per item with ``concurrency`` workers; merge results in item order.

    A map whose unfinished items alone would pass limits.maxNodeExecutions stops the run before
    any item starts; the workers pull items one at a time, so memory follows the concurrency,
    not the item count.
    """
    spec = node.spec.map
    assert spec is not None
    items = await expressions.evaluate_async(node.templates["items"], scope)
    if not isinstance(items, list):  # a misspelt path gives null: never an empty map
        raise state.NodeFailed(
            f"map.items {spec.items!r} gave {expressions.type_name(items)}, not an array"
        )
    if len(items) > spec.max_items:
        raise state.NodeFailed(
            f"map.items gave {len(items)} items, over map.maxItems={spec.max_items}"
        )
    run = frame.run
    keys = [f"{key}[{index}]" for index in range(len(items))]
    todo = [i for i, k in enumerate(keys) if _phase(run, k) != Phase.SUCCEEDED]
    if len(todo) > run.executions_left():
        raise state.RunStopped(
            Reason.NODE_EXECUTION_LIMIT_EXCEEDED,
            f'node "{key}": map.items gave {len(todo)} items to run, over the '
            f"{run.executions_left()} node executions limits.maxNodeExecutions="
            f"{run.spec.limits.max_node_executions} leaves",
        )
    retry = node.spec.retry or frame.compiled.spec.node_retry
    kind = next(k for k in ("agent", "tool", "flow") if getattr(spec, k) is not None)
    pending = iter(todo)
    paused = False
    # jq parses its whole input on every evaluation: handing each item the whole list would
    # make a long map quadratic, so the list is only there when the body can read it
    whole = {"items": items} if _reads_items(spec) else {}

    async def worker() -> None:
        nonlocal paused
        for index in pending:

            async def body(previous: flowrun_api.NodeStatus | None, index: int = index) -> Any:
                item_scope = frame.scope.scope(item=items[index], **whole)
                return await _map_body(frame, node, spec, keys[index], item_scope, previous)

            try:
                phase = await lifecycle.execute(run, keys[index], kind, body, retry)
            except state.NodeFailed as exc:
                raise state.NodeFailed(f"item {index}: {exc}", reason=exc.reason) from exc
            paused = paused or phase == Phase.WAITING

    await _all_or_none([worker() for _ in range(min(spec.concurrency, len(todo)))])
    if paused:
        raise state.Paused()
    results = [run.checkpoint.nodes[k].output for k in keys]
    output = envelope.from_value([(r or {}).get("json") for r in results])
    output["items"] = results
    return capabilities.NodeResult(output)


def _reads_items(spec: flow_api.MapNode) -> bool:
    """Whether the map's body may read ``.items`` (its text names ``items`` anywhere)."""
    body = spec.model_dump(exclude={"items", "concurrency", "max_items"}, exclude_none=True)
    return _ITEMS_WORD.search(json.dumps(body)) is not None


def _phase(run: state.Run, key: str) -> Phase | None:
    record = run.checkpoint.nodes.get(key)
    return None if record is None else record.phase


async def _all_or_none(coroutines: list[Any]) -> None:
    """Await every coroutine; on the first error cancel the others and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        for task in asyncio.as_completed(tasks):
            await task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _map_body(
    frame: state.Frame,
    node: graph.CompiledNode,
    spec: flow_api.MapNode,
    item_key: str,
    scope: expressions.Scope,
    previous: flowrun_api.NodeStatus | None,
) -> state.Result:
    t = node.templates
    if spec.flow is not None:
        value = await expressions.evaluate_async(t["input"], scope)
        return capabilities.NodeResult(
            envelope.from_value(await _subflow(frame, spec.flow, value, f"{item_key}/"))
        )
    ctx = frame.run.context(item_key, frame.depth, _resume_of(frame, previous))
    if spec.agent is not None:
        return await _agent(frame, spec.agent, node, scope, ctx, previous)
    assert spec.tool is not None
    args = await expressions.evaluate_async(t["args"], scope)
    return await _tool(frame, spec.tool, args, ctx, previous)
