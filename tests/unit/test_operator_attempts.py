"""Which runner attempts count against a Flow's ``retry.maxAttempts``: the lost ones only.

A run that pauses for a human ends its attempt with a Waiting result, and the decision starts
the next one; a loop through an approval does so once per iteration. Those attempts are not
retries. The operator reconciles a FlowRun served by a loopback API server
(``tests/support/fake_flowrun_api.py``) whose current attempt's pod is gone; what it writes to
the run's status and which pod it creates are what a user would see. The same rule on a real
control plane: ``tests/cluster/test_loops_cluster.py`` (a loop killed once at the default
``maxAttempts``) and ``tests/cluster/test_operator.py`` (``maxAttempts: 1``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentflows.controller import context, flowruns
from agentflows.controller.runtime import workqueue
from tests.support.fake_flowrun_api import FakeFlowRunApi, controller_on, pod_deleted

NAMESPACE, RUN = "team", "review-1"


def _flow(max_attempts: int, backoff_seconds: float) -> dict[str, Any]:
    return {
        "nodes": [{"id": "only", "transform": "=1"}],
        "retry": {"maxAttempts": max_attempts, "backoffSeconds": backoff_seconds},
    }


def _status(attempt: int, attempts_lost: int) -> dict[str, Any]:
    """Attempt ``attempt`` started and running; the ones before it paused for a decision or
    were lost (``attempts_lost`` of them); its pod is gone now."""
    return {
        "phase": "Running",
        "attempt": attempt,
        "pod": f"{RUN}-{attempt}",
        "podCreated": attempt,
        "attemptsLost": attempts_lost,
        "startTime": "2026-12-02T13:00:00Z",
        "result": {"attempt": attempt - 1, "phase": "Waiting", "message": "waiting"},
    }


@pytest.fixture
async def operator_on(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[FakeFlowRunApi, context.Controller]]:
    attempt, lost, max_attempts, backoff = request.param
    fake = FakeFlowRunApi(NAMESPACE, RUN, spec={"flow": "f"}, status=_status(attempt, lost))
    fake.snapshot(_flow(max_attempts, backoff))
    async with controller_on(fake) as ctl:
        yield fake, ctl


async def _reconcile(ctl: context.Controller) -> float | None:
    return await flowruns.reconcile(ctl, workqueue.Key(workqueue.FLOWRUN, NAMESPACE, RUN))


@pytest.mark.parametrize("operator_on", [(3, 0, 3, 0)], indirect=True)
async def test_attempts_started_by_human_decisions_do_not_count_against_max_attempts(
    operator_on: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator_on
    await _reconcile(ctl)

    status = fake.status
    assert status["phase"] == "Pending", status.get("message")
    assert (status["attempt"], status["attemptsLost"]) == (4, 1)
    assert list(fake.pods) == [f"{RUN}-4"]
    assert [e["reason"] for e in fake.events] == ["AttemptLost"]


@pytest.mark.parametrize("operator_on", [(5, 2, 3, 0)], indirect=True)
async def test_lost_attempts_count_against_max_attempts_across_human_decisions(
    operator_on: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator_on
    await _reconcile(ctl)

    status = fake.status
    assert (status["phase"], status["reason"]) == ("Failed", "RetriesExhausted")
    assert status["attempt"] == 5 and status["attemptsLost"] == 3
    assert f"pod {RUN}-5 is gone" in status["message"]
    assert "3 runner attempt(s) lost, retry.maxAttempts=3 allows 2" in status["message"]
    assert fake.pods == {}


@pytest.mark.parametrize("operator_on", [(3, 0, 3, 10)], indirect=True)
async def test_the_backoff_after_a_lost_attempt_doubles_per_lost_attempt_not_per_attempt(
    operator_on: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator_on
    again = await _reconcile(ctl)

    # the first lost attempt waits backoffSeconds (10 s), not 10 * 2**(attempt - 1)
    assert again is not None and 5 < again <= 10
    assert fake.status["message"].endswith("attempt 4 in 10s")
    assert fake.status["attemptsLost"] == 0 and fake.pods == {}


async def test_a_pod_deleted_before_its_run_records_it_is_a_lost_attempt_not_a_pod_to_create_again() -> (
    None
):
    # Attempt 1 reserved (status.pod written) and nothing created yet: the operator creates its
    # pod. The pod is deleted while the API still shows it Pending, before status.podCreated
    # says it exists (the kubelet can report Running seconds after the container started).
    reserved = {
        "phase": "Pending",
        "attempt": 1,
        "pod": f"{RUN}-1",
        "startTime": "2026-12-02T13:00:00Z",
    }
    fake = FakeFlowRunApi(NAMESPACE, RUN, spec={"flow": "f"}, status=reserved)
    fake.snapshot(_flow(max_attempts=1, backoff_seconds=0))
    async with controller_on(fake) as ctl:
        await _reconcile(ctl)
        assert list(fake.pods) == [f"{RUN}-1"]
        pod_deleted(ctl, fake.pods.pop(f"{RUN}-1"))
        await _reconcile(ctl)

    status = fake.status
    assert (status["phase"], status.get("reason")) == ("Failed", "RetriesExhausted"), status
    assert f"runner pod {RUN}-1 is gone" in status["message"]
    creates = [r for r in fake.requests if r.method == "POST" and r.path.endswith("/pods")]
    assert len(creates) == 1 and fake.pods == {}
