"""The runner's ``status.result``: typed as a run phase, and what the operator makes of it.

The runner ends an attempt Succeeded, Failed or Waiting; any other phase is not an attempt's
end and is refused by the model as by the CRD. The reason it names becomes the run's reason
when this operator knows it; a reason it does not know (a runner image of another version)
is kept in the run's message, and the run gets the reason of its phase.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from agentflows.api import crd
from agentflows.api.flowrun import RESULT_PHASES, RunnerResult, RunPhase
from agentflows.controller import flowruns
from agentflows.controller.runtime import workqueue
from tests.support.fake_flowrun_api import FakeFlowRunApi, controller_on


def test_a_result_is_typed_as_a_run_phase_and_written_as_the_same_word() -> None:
    result = RunnerResult.model_validate({"attempt": 2, "phase": "Waiting"})

    assert result.phase is RunPhase.WAITING
    assert result.to_wire() == {"attempt": 2, "phase": "Waiting"}


@pytest.mark.parametrize("phase", ["Running", "Pending", "Cancelled"])
def test_a_result_in_a_phase_no_attempt_ends_in_is_refused_naming_the_ones_that_are(
    phase: str,
) -> None:
    with pytest.raises(pydantic.ValidationError, match="one of Succeeded, Failed, Waiting"):
        RunnerResult.model_validate({"attempt": 1, "phase": phase})


def test_the_crd_offers_the_phases_an_attempt_ends_in_and_no_other() -> None:
    (flowruns_crd,) = [c for c in crd.build_crds() if c["spec"]["names"]["kind"] == "FlowRun"]
    schema = flowruns_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    phase = schema["properties"]["status"]["properties"]["result"]["properties"]["phase"]

    assert phase["enum"] == [p.value for p in RESULT_PHASES] == ["Succeeded", "Failed", "Waiting"]


async def _finished_with(result: dict[str, Any]) -> dict[str, Any]:
    status = {
        "phase": "Running",
        "attempt": 1,
        "pod": "r-1",
        "podCreated": 1,
        "startTime": "2026-12-02T13:00:00Z",
        "result": {"attempt": 1, **result},
    }
    fake = FakeFlowRunApi("team", "r", spec={"flow": "f"}, status=status)
    fake.snapshot({"nodes": [{"id": "only", "transform": "=1"}]})
    async with controller_on(fake) as ctl:
        await flowruns.reconcile(ctl, workqueue.Key(workqueue.FLOWRUN, "team", "r"))
    return fake.status


async def test_a_failed_result_gives_the_run_the_reason_the_runner_named() -> None:
    status = await _finished_with({"phase": "Failed", "reason": "Timeout", "message": "too long"})

    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed",
        "Timeout",
        "too long",
    )


async def test_a_reason_the_operator_does_not_know_is_kept_in_the_message() -> None:
    status = await _finished_with({"phase": "Failed", "reason": "Brandnew", "message": "boom"})

    assert (status["phase"], status["reason"]) == ("Failed", "RunFailed")
    assert status["message"] == "Brandnew: boom"
