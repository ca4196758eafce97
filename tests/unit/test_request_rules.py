"""One rule for which human requests wait (``agentflows.api.requests``), read by every surface."""

from __future__ import annotations

import datetime as dt
from typing import Any

from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.api import times
from agentflows.cli import views
from agentflows.console import runs_view

NOW = dt.datetime(2026, 1, 2, 3, 0, tzinfo=dt.UTC)


def run(phase: str = "Waiting") -> dict[str, Any]:
    past, future = times.timestamp(NOW - dt.timedelta(hours=1)), "2999-01-01T00:00:00Z"
    return {
        "metadata": {"name": "r"},
        "status": {
            "phase": phase,
            "nodes": {
                "a": {"phase": "Waiting"},
                "b": {"phase": "Waiting"},
                "c": {"phase": "Running"},
                "d": {"phase": "Waiting"},
            },
            "requests": {
                "open": {"node": "a", "kind": "approval", "expiresAt": future},
                "late": {"node": "b", "kind": "approval", "expiresAt": past},
                "rerun": {"node": "c", "kind": "approval"},
                "done": {"node": "d", "kind": "approval", "decision": "approve"},
                "early": {"node": "e", "kind": "input"},
            },
        },
    }


def test_pending_is_undecided_with_its_node_waiting_and_expired_ones_stay_for_the_operator() -> (
    None
):
    status = flowrun_api.FlowRunStatus.model_validate(run()["status"])
    assert sorted(human_requests.pending(status)) == ["early", "late", "open"]
    assert sorted(human_requests.decidable(status, NOW)) == ["early", "open"]


def test_the_cli_and_the_console_offer_the_same_requests_and_none_once_the_run_ended() -> None:
    assert sorted(views.pending_requests(run())) == sorted(runs_view.pending(run()))
    assert sorted(views.pending_requests(run())) == ["early", "open"]
    assert views.pending_requests(run("Failed")) == {} == runs_view.pending(run("Failed"))
    assert views.pending_requests(run())["open"].expires_at == "2999-01-01T00:00:00Z"


def test_a_decision_problem_names_the_field_and_what_is_valid() -> None:
    asked = flowrun_api.HumanRequest(node="n", kind="input", schema={"type": "integer"})
    decided = asked.model_copy(update={"decision": flowrun_api.Decision.APPROVE})
    assert human_requests.decision_problem(decided) == (
        "decision 'approve' is not valid for an input request (valid: reject, respond)"
    )
    answered = asked.model_copy(update={"decision": flowrun_api.Decision.RESPOND, "data": "x"})
    assert human_requests.decision_problem(answered, asked.schema_) == (
        "data does not match the request's schema: 'x' is not of type 'integer'"
    )
    assert (
        human_requests.decision_problem(answered.model_copy(update={"data": 3}), asked.schema_)
        is None
    )
