"""Runner attempts: reserve the next attempt in status, then create its pod exactly once.

Order matters. The attempt and pod name go into status first, because the runner may write only
the FlowRun whose ``status.pod`` is its own pod (``config/policies``). Then the pod is created
(AlreadyExists is fine) and the FlowRun is annotated ``agentflows.io/pod-created=<attempt>``.
From then on a missing pod of that attempt is a lost attempt and is never created again, so a
restarted operator never runs an attempt twice; attempt numbers only grow.
"""

from __future__ import annotations

import logging
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import conditions, context, events, labels, pods, runstate, snapshots
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: Seconds before trying again to create a pod the API server refused.
POD_CREATE_RETRY_SECONDS = 10.0


def created_attempt(run: runstate.RunContext) -> int:
    """The highest attempt whose pod the operator has created."""
    annotations = run.obj["metadata"].get("annotations") or {}
    try:
        return int(annotations.get(labels.POD_CREATED, "0"))
    except ValueError:
        return 0


def remaining_seconds(run: runstate.RunContext, flow_spec: flow_api.FlowSpec) -> float | None:
    """Seconds left of ``limits.timeoutSeconds`` (counted from startTime, waiting included)."""
    timeout = flow_spec.limits.timeout_seconds
    started = conditions.parse_time(run.get("startTime"))
    if timeout is None or started is None:
        return None
    return timeout - (conditions.now() - started).total_seconds()


async def start_next(
    ctl: context.Controller, run: runstate.RunContext, snapshot: dict[str, Any], why: str
) -> float | None:
    """Reserve attempt ``run.attempt + 1``, save, and create its pod."""
    attempt = run.attempt + 1
    run.reserve_attempt(attempt)
    run.set_phase(RunPhase.PENDING, RunReason.ATTEMPT_STARTED, f"attempt {attempt}: {why}")
    await run.save(ctl)
    return await create_pod(ctl, run, snapshot)


async def create_pod(
    ctl: context.Controller, run: runstate.RunContext, snapshot: dict[str, Any]
) -> float | None:
    """Create the current attempt's pod (idempotent) and mark it created."""
    attempt = run.attempt
    flow_spec, flows, agent_specs = snapshots.specs(snapshot)
    remaining = remaining_seconds(run, flow_spec)
    body = pods.runner_pod(
        run.obj,
        attempt,
        snapshot["flow"],
        flows,
        agent_specs,
        ctl.config,
        deadline_seconds=None if remaining is None else int(remaining) + 1,
    )
    try:
        await ctl.api.create(kube.path_of("pods", run.namespace), body)
    except kube.ApiError as exc:
        if not exc.conflict:
            log.warning("pod %s/%s: %s", run.namespace, body["metadata"]["name"], exc)
            message = f"cannot create runner pod {body['metadata']['name']}: {exc.message}"
            if run.get("reason") != RunReason.POD_CREATE_FAILED:
                run.event(events.WARNING, RunReason.POD_CREATE_FAILED, message)
            run.set_message(RunReason.POD_CREATE_FAILED, message)
            await run.save(ctl)
            return POD_CREATE_RETRY_SECONDS
    else:
        ctl.metrics.pod_attempts.labels(run.namespace, run.flow).inc()
        run.event(events.NORMAL, "PodCreated", f"attempt {attempt}: pod {body['metadata']['name']}")
    stored = await ctl.api.merge_patch(
        run.path, {"metadata": {"annotations": {labels.POD_CREATED: str(attempt)}}}
    )
    run.refresh(stored)
    await run.save(ctl)
    return None


def agent_models(agent_specs: dict[str, agent_api.AgentSpec]) -> dict[str, str]:
    """Agent name -> model name (a metrics label)."""
    return {name: spec.model.name for name, spec in agent_specs.items()}
