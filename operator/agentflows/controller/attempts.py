"""Runner attempts: reserve the next attempt in status, then create its pod exactly once.

Order matters. The attempt and pod name go into status first, because the runner may write only
the FlowRun whose ``status.pod`` is its own pod (``config/policies``). Then the pod is created
(AlreadyExists is fine). The operator's next status write once the pod runs records
``status.podCreated=<attempt>`` with it (no write of its own): from then on a missing pod of that
attempt is a lost attempt and is never created again, so a restarted operator never runs an
attempt twice; attempt numbers only grow. Until then the pod's name is what proves it exists: a
second create of the same attempt is refused as AlreadyExists. And a pod deleted before that
record (while still Pending in the API, which can lag its container by seconds) is lost too,
not created again: the operator remembers the attempts whose pod it created or saw
(``Controller.pods_seen``). Only an operator restarted inside that window, with the pod deleted
while it was down, cannot tell such a pod from one never created and creates it; the runner
then resumes from the run's status, as after any lost attempt.

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
from agentflows.api import retry, times
from agentflows.api import snapshot as snapshot_api
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import budgets, context, events, pods, runstate
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: The condition saying whether the current attempt's pod could be created.
POD_CREATED = "PodCreated"
#: Seconds before trying again to create a refused pod: the time since the first refusal (the
#: condition's lastTransitionTime, which a restarted operator reads too), from 5 s up to 60 s,
#: so the waits double.
POD_CREATE_BACKOFF = retry.Backoff(initial=5.0, cap=60.0)


def remaining_seconds(run: runstate.RunContext, flow_spec: flow_api.FlowSpec) -> float | None:
    """Seconds left of ``limits.timeoutSeconds`` (counted from startTime, waiting included)."""
    timeout = flow_spec.limits.timeout_seconds
    started = times.parse_time(run.status.start_time)
    if timeout is None or started is None:
        return None
    return timeout - (times.now() - started).total_seconds()


async def start_next(
    ctl: context.Controller, run: runstate.RunContext, snapshot: snapshot_api.Snapshot, why: str
) -> float | None:
    """Reserve attempt ``run.attempt + 1``, save, and create its pod."""
    ctl.pods_seen.discard((run.namespace, run.name, run.attempt))
    attempt = run.attempt + 1
    run.reserve_attempt(attempt)
    run.set_phase(RunPhase.PENDING, RunReason.ATTEMPT_STARTED, f"attempt {attempt}: {why}")
    await run.save(ctl)
    return await create_pod(ctl, run, snapshot)


def mark_created(run: runstate.RunContext, pod_name: str) -> None:
    """Record (with the next status write) that the current attempt's pod exists."""
    if run.status.pod_created < run.attempt:
        run.status.pod_created = run.attempt
    run.set_condition(POD_CREATED, "True", "Created", f"attempt {run.attempt}: pod {pod_name}")


def pod_body(
    ctl: context.Controller, run: runstate.RunContext, snapshot: snapshot_api.Snapshot
) -> dict[str, Any]:
    """The current attempt's pod."""
    remaining = remaining_seconds(run, snapshot.flow_spec)
    return pods.runner_pod(
        run.obj,
        run.attempt,
        snapshot.flow,
        snapshot.flow_specs,
        snapshot.agent_specs,
        ctl.config,
        status=run.stored,
        deadline_seconds=None if remaining is None else int(remaining) + 1,
        budget=budgets.run_cap(ctl, run),
    )


async def post_pod(
    ctl: context.Controller, run: runstate.RunContext, body: dict[str, Any]
) -> kube.ApiError | None:
    """Create the pod (AlreadyExists is fine); the API's refusal, if it refused.

    Either way the attempt's pod exists now: it goes into ``ctl.pods_seen`` until
    ``status.podCreated`` records it, so a pod deleted before it runs counts as lost.
    """
    try:
        ctl.cache.stored(await ctl.api.create(kube.path_of("pods", run.namespace), body))
    except kube.ApiError as exc:
        if not exc.conflict:
            return exc
    else:
        ctl.metrics.pod_attempts.labels(run.namespace, run.flow).inc()
    ctl.pods_seen.add((run.namespace, run.name, run.attempt))
    return None


async def created(
    ctl: context.Controller,
    run: runstate.RunContext,
    body: dict[str, Any],
    refusal: kube.ApiError | None,
) -> float | None:
    """After a create: record a refusal, or that a refused pod is created now."""
    if refusal is not None:
        return await _refused(ctl, run, body, refusal)
    refused = run.condition(POD_CREATED)
    if refused is not None and refused.status == "False":
        # it was refused before: say at once that it is created now
        pod_name = body["metadata"]["name"]
        mark_created(run, pod_name)
        run.set_message(RunReason.POD_PENDING, f"attempt {run.attempt}: pod {pod_name} created")
        await run.save(ctl)
    return None


async def post_grants(
    ctl: context.Controller, run: runstate.RunContext, grants: list[dict[str, Any]]
) -> kube.ApiError | None:
    """Create the run's Role and RoleBinding (AlreadyExists is fine); the API's refusal."""
    for grant in grants:
        path = kube.path_of(f"{grant['kind'].lower()}s", run.namespace)
        try:
            await ctl.api.create(path, grant)
        except kube.ApiError as exc:
            if not exc.conflict:
                return exc
    return None


async def post_attempt(
    ctl: context.Controller,
    run: runstate.RunContext,
    snapshot: snapshot_api.Snapshot,
    body: dict[str, Any],
) -> kube.ApiError | None:
    """Create the grant of the memories the run may write, then the pod; a refusal of either.

    The grant (:func:`pods.sessions_grant`) comes first, so the pod's first session write
    finds it; a refused grant is shown as a refused pod (condition, Event, retried).
    """
    grant = pods.sessions_grant(body, run.obj, sorted(ctl.snapshots.memories(snapshot)))
    refusal = await post_grants(ctl, run, grant)
    return refusal or await post_pod(ctl, run, body)


async def create_pod(
    ctl: context.Controller, run: runstate.RunContext, snapshot: snapshot_api.Snapshot
) -> float | None:
    """Create the current attempt's pod (idempotent); its record goes with the next write."""
    body = pod_body(ctl, run, snapshot)
    return await created(ctl, run, body, await post_attempt(ctl, run, snapshot, body))


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
    if run.status.message != message:
        run.event(events.WARNING, RunReason.POD_CREATE_FAILED, message)
    run.set_message(RunReason.POD_CREATE_FAILED, message)
    run.set_condition(POD_CREATED, "False", reason, message)
    await run.save(ctl)
    refused = run.condition(POD_CREATED)
    since = times.parse_time(refused.last_transition_time if refused else None)
    waited = (times.now() - since).total_seconds() if since else 0.0
    return POD_CREATE_BACKOFF.delay_since(waited)


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
