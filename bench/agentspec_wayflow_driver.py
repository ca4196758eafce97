"""Run Agent Spec cases on WayFlow (wayflowcore), for bench/agentspec_conformance.py.

Runs in its own environment (wayflowcore 26.3.1 needs mcp<2, so it does not install next to
agentflows): the bench starts it with that environment's python and writes one case per line
of JSON on stdin ``{"doc", "inputs", "messages", "client_results"}``; for each it prints one
line of JSON ``{"finished", "outputs", "said", "error"}``. It imports nothing of agentflows.

The conversation is driven as a host would: ``execute()``; a user message request gets the
case's next message (none left: the conversation stops, unfinished), a client tool request
the case's result for that tool, a confirmation is confirmed.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

#: execute() calls before a case is stopped (a conversation that never ends).
MAX_STEPS = 20


def _tools() -> dict[str, Any]:
    """The public functions of agentspec_conformance_tools.py, by name (ServerTools)."""
    path = Path(__file__).with_name("agentspec_conformance_tools.py")
    spec = importlib.util.spec_from_file_location("agentspec_conformance_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {
        name: fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == module.__name__
    }


def run_case(case: dict[str, Any], tools: dict[str, Any]) -> dict[str, Any]:
    """Drive one case; what it said to the user, and its outputs if it finished."""
    from wayflowcore.agentspec import AgentSpecLoader
    from wayflowcore.executors.executionstatus import (
        FinishedStatus,
        ToolExecutionConfirmationStatus,
        ToolRequestStatus,
        UserMessageRequestStatus,
    )
    from wayflowcore.tools import ToolResult

    component = AgentSpecLoader(tool_registry=tools).load_json(case["doc"])
    inputs = case.get("inputs") or {}
    conv = component.start_conversation(inputs=inputs) if inputs else component.start_conversation()
    messages = list(case.get("messages") or [])
    if case.get("user_first") and messages:
        conv.append_user_message(messages.pop(0))
    said: list[str] = []
    for _ in range(MAX_STEPS):
        status = conv.execute()
        if isinstance(status, FinishedStatus):
            return {"finished": True, "outputs": status.output_values, "said": said}
        if isinstance(status, UserMessageRequestStatus):
            said.append(status.message.content if status.message is not None else "")
            if not messages:
                return {"finished": False, "outputs": None, "said": said}
            conv.append_user_message(messages.pop(0))
        elif isinstance(status, ToolRequestStatus):
            for request in status.tool_requests:
                result = (case.get("client_results") or {}).get(request.name)
                conv.append_tool_result(
                    ToolResult(content=result, tool_request_id=request.tool_request_id)
                )
        elif isinstance(status, ToolExecutionConfirmationStatus):
            for request in status.tool_requests:
                status.confirm_tool_execution(tool_request=request)
        else:
            return {"finished": False, "outputs": None, "said": said, "error": repr(status)}
    return {"finished": False, "outputs": None, "said": said, "error": "too many steps"}


def main() -> None:
    """Answer each case line on stdin with a result line on stdout."""
    tools = _tools()
    for line in sys.stdin:
        case = json.loads(line)
        try:
            result = run_case(case, tools)
        except Exception as exc:  # a case the runtime refuses or fails: reported, not fatal
            result = {"finished": False, "outputs": None, "said": [], "error": f"{exc!r}"[:600]}
        print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
