"""A FlowRun whose Flow or Agents reach the operator's cache after it is admitted, not failed.

Watches of different kinds are not ordered: ``kubectl apply -f`` of one file holding a Flow, its
Agent and a FlowRun may deliver the FlowRun first. The operator reconciles a new FlowRun served
by a loopback API server (``tests/support/fake_flowrun_api.py``) that holds what the cache does
not yet; the run must start, and must fail with FlowNotFound only when the API server itself
has no such Flow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentflows.controller import context, flowruns
from agentflows.controller.runtime import workqueue
from tests.support.fake_flowrun_api import FakeFlowRunApi, controller_on

NAMESPACE, RUN = "team", "support-1"


def _object(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "generation": 1}
    return {"apiVersion": "agentflows.io/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


FLOW = _object(
    "Flow", "support", {"nodes": [{"id": "answer", "agent": {"name": "helper", "prompt": "hi"}}]}
)
AGENT = _object(
    "Agent", "helper", {"model": {"name": "openai/gpt-4o-mini"}, "systemPrompt": "Help."}
)


@pytest.fixture
async def operator() -> AsyncIterator[tuple[FakeFlowRunApi, context.Controller]]:
    fake = FakeFlowRunApi(NAMESPACE, RUN, spec={"flow": "support"})
    async with controller_on(fake) as ctl:  # only the FlowRun's watch event has arrived
        yield fake, ctl


async def _reconcile(ctl: context.Controller) -> None:
    await flowruns.reconcile(ctl, workqueue.Key(workqueue.FLOWRUN, NAMESPACE, RUN))


async def test_a_run_whose_flow_and_agent_are_not_cached_yet_starts_from_what_the_api_holds(
    operator: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator
    fake.flows["support"] = FLOW
    fake.agents["helper"] = AGENT

    await _reconcile(ctl)

    assert fake.status.get("reason") != "FlowNotFound", fake.status.get("message")
    assert fake.status.get("attempt") == 1, fake.status
    assert list(fake.pods) == [fake.status["pod"]]
    snapshot = fake.configmaps[f"{RUN}-snapshot"]["data"]["snapshot.json"]
    assert '"helper"' in snapshot
    # One GET each, and the cache now holds them for the next run.
    assert (fake.count("GET", "flows"), fake.count("GET", "agents")) == (1, 1)
    assert ctl.cache.flow(NAMESPACE, "support") is not None
    assert ctl.cache.agent(NAMESPACE, "helper") is not None


async def test_a_run_whose_flow_the_api_server_does_not_hold_fails_with_flow_not_found(
    operator: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator

    await _reconcile(ctl)

    assert (fake.status["phase"], fake.status["reason"]) == ("Failed", "FlowNotFound")
    assert fake.status["message"] == f'Flow "support" does not exist in namespace {NAMESPACE}'
    assert fake.count("GET", "flows") == 1
    assert not fake.pods


async def test_a_cached_flow_costs_no_request_to_the_api_server(
    operator: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator
    ctl.cache.stored(FLOW)
    ctl.cache.stored(AGENT)

    await _reconcile(ctl)

    assert fake.status.get("attempt") == 1, fake.status
    assert (fake.count("GET", "flows"), fake.count("GET", "agents")) == (0, 0)
