"""The FlowRun lifecycle: level-triggered, idempotent, safe to run again at any moment.

Reconciler for keys of kind FlowRun; handlers enqueue a run on any event of the run or of its
pods. Each reconcile reads the run, decides from what it sees, and writes operator keys:

- finished -> only the TTL is left (:mod:`finishing`);
- ``spec.cancel`` -> delete the pod, Cancelled;
- no attempt yet -> :func:`admission.start` (snapshot, concurrency policy, attempt 1);
- past ``limits.timeoutSeconds`` since startTime (waiting included) -> delete the pod, Failed
  with reason Timeout;
- human requests: new ones and new decisions are announced and checked (:mod:`requests`);
- the runner's ``status.result`` for the current attempt -> Succeeded / Failed / Waiting; a
  Waiting run whose request got an accepted decision, or whose approval or input request
  passed its ``expiresAt`` (the engine applies ``onTimeout``) -> next attempt; else it looks
  again at the first ``expiresAt``;
- the attempt's pod Pending / Running -> that phase; gone, or ended without a result -> lost:
  the next attempt after ``retry.backoffSeconds`` (doubling per attempt) up to
  ``retry.maxAttempts``, then Failed with reason RetriesExhausted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentflows.api import flow as flow_api
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import (
    admission,
    attempts,
    context,
    events,
    finishing,
    labels,
    requests,
    runstate,
    snapshots,
    workqueue,
)
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: How often an active run is looked at without any event (a safety net; events drive it).
_RUNNING_RESYNC = 30.0


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Reconcile one FlowRun; return when to look again."""
    try:
        obj = await ctl.api.get(kube.path_of("flowruns", key.namespace, key.name))
    except kube.ApiError as exc:
        if exc.not_found:
            ctl.forget_run(key.namespace, key.name)
            return None
        raise
    run = runstate.RunContext.of(obj)
    if run.phase is not None and run.phase.terminal:
        run.observe(ctl)
        return await finishing.after_finished(ctl, run)
    await _ensure_flow_label(ctl, run)
    if (obj.get("spec") or {}).get("cancel"):
        return await finishing.finish(
            ctl,
            run,
            RunPhase.CANCELLED,
            RunReason.CANCELLED,
            "spec.cancel was set",
            delete_pod=True,
        )
    if run.phase is None:
        run.set_phase(RunPhase.PENDING, RunReason.PENDING, f"run of Flow {run.flow} created")
        await run.save(ctl)
    if run.attempt == 0:
        return await admission.start(ctl, run)
    snapshot = await snapshots.read(ctl.api, run.namespace, run.name)
    if snapshot is None:
        message = f"snapshot ConfigMap {snapshots.name_of(run.name)} is missing"
        return await finishing.finish(
            ctl, run, RunPhase.FAILED, RunReason.SNAPSHOT_MISSING, message, delete_pod=True
        )
    flow_spec = snapshots.specs(snapshot)[0]
    if run.status.get("requests"):
        await requests.review(ctl, run)
    remaining = attempts.remaining_seconds(run, flow_spec)
    if remaining is not None and remaining <= 0:
        message = f"the run exceeded limits.timeoutSeconds={flow_spec.limits.timeout_seconds}"
        return await finishing.finish(
            ctl, run, RunPhase.FAILED, RunReason.TIMEOUT, message, delete_pod=True
        )
    requeue = await _follow(ctl, run, snapshot, flow_spec)
    await run.save(ctl)
    if run.phase is not None and run.phase.terminal:
        return requeue
    candidates = [t for t in (requeue, remaining, _RUNNING_RESYNC) if t is not None]
    return min(candidates)


async def _ensure_flow_label(ctl: context.Controller, run: runstate.RunContext) -> None:
    current = (run.obj["metadata"].get("labels") or {}).get(labels.FLOW)
    if current != run.flow and run.flow:
        stored = await ctl.api.merge_patch(
            run.path, {"metadata": {"labels": {labels.FLOW: run.flow}}}
        )
        run.refresh(stored)


async def _get_pod(ctl: context.Controller, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        pod: dict[str, Any] = await ctl.api.get(kube.path_of("pods", namespace, name))
    except kube.ApiError as exc:
        if exc.not_found:
            return None
        raise
    return pod


async def _follow(
    ctl: context.Controller,
    run: runstate.RunContext,
    snapshot: dict[str, Any],
    flow_spec: flow_api.FlowSpec,
) -> float | None:
    """Follow the current attempt: its result, else its pod."""
    result = run.result()
    if result is not None:
        return await _on_result(ctl, run, snapshot, result)
    if attempts.created_attempt(run) < run.attempt:
        return await attempts.create_pod(ctl, run, snapshot)
    pod_name = labels.pod_name(run.name, run.attempt)
    pod = await _get_pod(ctl, run.namespace, pod_name)
    if pod is None:
        return await _lost(ctl, run, snapshot, flow_spec, f"runner pod {pod_name} is gone")
    if pod["metadata"].get("deletionTimestamp"):
        return 2.0
    pod_phase = (pod.get("status") or {}).get("phase", "Pending")
    if pod_phase == "Pending":
        if run.phase is not RunPhase.PENDING:
            run.set_phase(
                RunPhase.PENDING, RunReason.POD_PENDING, f"runner pod {pod_name} is starting"
            )
        return None
    if pod_phase == "Running":
        run.set_phase(
            RunPhase.RUNNING, RunReason.RUNNING, f"attempt {run.attempt} running in pod {pod_name}"
        )
        return None
    if pod_phase not in ("Succeeded", "Failed"):
        # Unknown: the node is unreachable and the runner may still run; never start a second
        # runner next to it. The pod's deletion (by whoever evicts it) moves the run on.
        return None
    # The pod ended. The runner writes its result before it exits, so look once more.
    run.refresh(await ctl.api.get(run.path))
    result = run.result()
    if result is not None:
        return await _on_result(ctl, run, snapshot, result)
    why = f"runner pod {pod_name} ended ({_describe_exit(pod)}) without a result"
    return await _lost(ctl, run, snapshot, flow_spec, why)


def _describe_exit(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            reason = terminated.get("reason") or "Terminated"
            return f"exit code {terminated.get('exitCode')}, {reason}"
    return str(status.get("reason") or status.get("phase", "unknown"))


async def _on_result(
    ctl: context.Controller,
    run: runstate.RunContext,
    snapshot: dict[str, Any],
    result: dict[str, Any],
) -> float | None:
    """Act on the runner's result for the current attempt."""
    phase = result.get("phase")
    message = str(result.get("message") or "")
    if phase == RunPhase.SUCCEEDED.value:
        reason = result.get("reason") or RunReason.SUCCEEDED
        return await finishing.finish(
            ctl, run, RunPhase.SUCCEEDED, reason, message or "the flow finished"
        )
    if phase == RunPhase.FAILED.value:
        reason = result.get("reason") or RunReason.RUN_FAILED
        return await finishing.finish(ctl, run, RunPhase.FAILED, reason, message or "failed")
    return await _on_waiting(ctl, run, snapshot, message)


async def _on_waiting(
    ctl: context.Controller, run: runstate.RunContext, snapshot: dict[str, Any], message: str
) -> float | None:
    """The attempt paused: resume once a request is decided or expired, else wait (Waiting)."""
    decided = requests.resumable(run)
    if decided:
        why = f"request(s) {', '.join(decided)} decided"
        return await attempts.start_next(ctl, run, snapshot, why)
    expired = requests.expired(run.status)
    if expired:
        requests.mark_expired(ctl, run, expired)
        why = f"request(s) {', '.join(expired)} expired"
        return await attempts.start_next(ctl, run, snapshot, why)
    undecided = sorted(requests.pending(run.status))
    text = f"waiting for a decision on request(s) {', '.join(undecided) or '(none)'}"
    run.set_phase(RunPhase.WAITING, RunReason.WAITING, message or text)
    return requests.seconds_to_expiry(run.status)


async def _lost(
    ctl: context.Controller,
    run: runstate.RunContext,
    snapshot: dict[str, Any],
    flow_spec: flow_api.FlowSpec,
    why: str,
) -> float | None:
    """The current attempt ended without a result: retry after the backoff, or give up."""
    retry = flow_spec.retry
    if run.attempt >= retry.max_attempts:
        message = f"{why}; attempt {run.attempt} of {retry.max_attempts} was the last"
        return await finishing.finish(
            ctl, run, RunPhase.FAILED, RunReason.RETRIES_EXHAUSTED, message
        )
    key = (run.namespace, run.name, run.attempt)
    loop = asyncio.get_running_loop()
    if key not in ctl.lost_at:
        ctl.lost_at[key] = loop.time()
        run.event(events.WARNING, RunReason.ATTEMPT_LOST, f"attempt {run.attempt}: {why}")
    backoff = float(retry.backoff_seconds) * 2.0 ** (run.attempt - 1)
    left = backoff - (loop.time() - ctl.lost_at[key])
    if left > 0:
        run.set_message(RunReason.ATTEMPT_LOST, f"{why}; attempt {run.attempt + 1} in {left:.0f}s")
        return left
    del ctl.lost_at[key]
    return await attempts.start_next(ctl, run, snapshot, f"retrying after: {why}")
