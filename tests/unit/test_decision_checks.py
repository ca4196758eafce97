"""The operator takes back an edit decision whose edits would be ignored (the console refuses it)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentflows.api import flowrun as flowrun_api
from agentflows.controller import requests


def edited(kind: str, proposal: Any, edits: Any) -> flowrun_api.HumanRequest:
    return flowrun_api.HumanRequest.model_validate(
        {"node": "ship", "kind": kind, "proposal": proposal, "decision": "edit", "edits": edits}
    )


def problem(request: flowrun_api.HumanRequest) -> str | None:
    # an edit decision is judged from the request alone: no API read, no run needed
    return asyncio.run(requests.problem(None, None, request))  # type: ignore[arg-type]


TWO_CALLS = {"calls": [{"id": "c1", "name": "deploy"}, {"id": "c2", "name": "notify"}]}


def test_edits_of_two_waiting_calls_not_keyed_by_call_id_are_taken_back_naming_the_ids() -> None:
    found = problem(edited("tool", TWO_CALLS, {"version": "v1"}))
    assert found == (
        "edits: 2 calls wait, so give an object keyed by call id (valid: c1, c2) "
        "with each call's new arguments"
    )
    assert problem(edited("tool", TWO_CALLS, {"c1": {"version": "v1"}})) is None


def test_edits_of_a_reviewed_action_that_are_not_an_object_are_taken_back() -> None:
    proposal = {"tool": "deploy", "args": {"version": "v2"}}
    found = problem(edited("review", proposal, "v1"))
    assert found == "edits: they replace the arguments of deploy, so give a JSON object"
    assert problem(edited("review", proposal, {"version": "v1"})) is None
