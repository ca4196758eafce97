"""Runner attempts: reserve the next attempt in status, then create its pod exactly once.

Order matters. The attempt and pod name go into status first, because the runner may write only
the FlowRun whose ``status.pod`` is its own pod (``config/policies``). Then the pod is created
(AlreadyExists is fine) and the FlowRun is annotated ``agentflows.io/pod-created=<attempt>``.
From then on a missing pod of that attempt is a lost attempt and is never created again, so a
restarted operator never runs an attempt twice; attempt numbers only grow.

A pod the API server refuses (no ServiceAccount, a quota, an admission policy) is shown where
users look: the ``PodCreated`` condition False with the API's reason and message and what to do,
the run's reason ``PodCreateFailed`` (``kubectl get flowruns -o wide``), a Warning Event per
distinct message, and ``agentflows_pod_create_failures_total{namespace,reason}``. The same pod
is tried again with a backoff that doubles from the first refusal (5 s up to 60 s), so the run
goes on by itself once the cause is fixed.
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

#: The condition saying whether the current attempt's pod could be created.
POD_CREATED = "PodCreated"
#: Seconds before trying again to create a refused pod: the time since the first refusal,
#: within these bounds (so the waits double).
POD_CREATE_RETRY_MIN_SECONDS = 5.0
POD_CREATE_RETRY_MAX_SECONDS = 60.0


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
    pod_name = body["metadata"]["name"]
    try:
        await ctl.api.create(kube.path_of("pods", run.namespace), body)
    except kube.ApiError as exc:
        if not exc.conflict:
            return await _refused(ctl, run, body, exc)
    else:
        ctl.metrics.pod_attempts.labels(run.namespace, run.flow).inc()
        run.event(events.NORMAL, "PodCreated", f"attempt {attempt}: pod {pod_name}")
    run.set_condition(POD_CREATED, "True", "Created", f"attempt {attempt}: pod {pod_name}")
    if run.get("reason") == RunReason.POD_CREATE_FAILED:
        run.set_message(RunReason.POD_PENDING, f"attempt {attempt}: pod {pod_name} created")
    stored = await ctl.api.merge_patch(
        run.path, {"metadata": {"annotations": {labels.POD_CREATED: str(attempt)}}}
    )
    run.refresh(stored)
    await run.save(ctl)
    return None


async def _refused(
    ctl: context.Controller, run: runstate.RunContext, body: dict[str, Any], exc: kube.ApiError
) -> float:
    """Record a refused pod (condition, reason, Event, metric); the seconds until the next try."""
    pod_name = body["metadata"]["name"]
    log.warning("pod %s/%s: %s", run.namespace, pod_name, exc)
    reason = exc.reason if exc.reason and exc.reason.isalnum() else RunReason.POD_CREATE_FAILED
    ctl.metrics.pod_create_failures.labels(run.namespace, reason).inc()
    message = (
        f"cannot create runner pod {pod_name}: {exc.message}; {remedy(body, exc)}; "
        "the operator tries again"
    )
    if run.get("message") != message:
        run.event(events.WARNING, RunReason.POD_CREATE_FAILED, message)
    run.set_message(RunReason.POD_CREATE_FAILED, message)
    run.set_condition(POD_CREATED, "False", reason, message)
    await run.save(ctl)
    since = conditions.parse_time(
        (conditions.condition_of(run.get("conditions"), POD_CREATED) or {}).get(
            "lastTransitionTime"
        )
    )
    waited = (conditions.now() - since).total_seconds() if since else 0.0
    return min(POD_CREATE_RETRY_MAX_SECONDS, max(POD_CREATE_RETRY_MIN_SECONDS, waited))


def remedy(body: dict[str, Any], exc: kube.ApiError) -> str:
    """What to do about a refused runner pod, from the API server's message."""
    namespace = body["metadata"]["namespace"]
    text = exc.message.lower()
    if "service account" in text or "serviceaccount" in text:
        account = body["spec"]["serviceAccountName"]
        return (
            f"create ServiceAccount {account} in {namespace} (helm: add {namespace} to "
            f"runnerNamespaces; kustomize: kubectl apply -k config/rbac/runner -n {namespace})"
        )
    if "quota" in text:
        return f"raise the ResourceQuota of {namespace} or lower the Flow's spec.runner.resources"
    if exc.status in (400, 403, 422):
        return "change what the API server refused (an admission policy or the pod's spec)"
    return "check that the API server is reachable and accepts the operator's requests"


def agent_models(agent_specs: dict[str, agent_api.AgentSpec]) -> dict[str, str]:
    """Agent name -> model name (a metrics label)."""
    return {name: spec.model.name for name, spec in agent_specs.items()}
