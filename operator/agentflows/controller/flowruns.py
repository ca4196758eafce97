"""The FlowRun lifecycle: level-triggered, idempotent, safe to run again at any moment.

Reconciler for keys of kind FlowRun; the cache enqueues a run on any change of the run or of its
pods. Each reconcile reads the run and its pod from the cache (no API read), decides from what
it sees, and writes the operator's status keys once:

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
- the attempt's pod Pending / Running -> that phase; gone, or ended without a result -> lost
  (counted in ``status.attemptsLost``): the next attempt after ``retry.backoffSeconds``
  (doubling per lost attempt) while the first attempt and the lost ones stay within
  ``retry.maxAttempts``, then Failed with reason RetriesExhausted. Attempts started by a
  human's decision do not count.
"""

from __future__ import annotations

import asyncio
import logging

from agentflows.api import flow as flow_api
from agentflows.api import requests as human_requests
from agentflows.api import retry as retry_policy
from agentflows.api import snapshot as snapshot_api
from agentflows.api.flowrun import RunnerResult, RunPhase, RunReason
from agentflows.controller import (
    admission,
    attempts,
    budgets,
    cache,
    context,
    events,
    finishing,
    requests,
    runstate,
)
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube
from agentflows.kube import objects

log = logging.getLogger(__name__)

#: How often an active run is looked at without any event (a safety net; events drive it).
_RUNNING_RESYNC = 30.0
#: An ended pod whose run shows no result yet is looked at again this soon (the runner's last
#: write and the pod's end arrive on different watches) before the run is read to be sure.
_RESULT_GRACE_SECONDS = 0.5


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Reconcile one FlowRun; return when to look again."""
    cached = ctl.cache.run_of(key.namespace, key.name)
    if cached is None:
        ctl.forget_run(key.namespace, key.name)
        return None
    run = runstate.RunContext.of(cached)
    if run.phase is not None and run.phase.terminal:
        run.observe(ctl)
        return await finishing.after_finished(ctl, run)
    if cached.model.spec.cancel:
        return await finishing.finish(
            ctl,
            run,
            RunPhase.CANCELLED,
            RunReason.CANCELLED,
            "spec.cancel was set",
            delete_pod=True,
        )
    if run.attempt == 0:
        return await admission.start(ctl, run)
    snapshot = await ctl.snapshots.of_run(ctl.api, run.obj)
    if snapshot is None:
        message = (
            f"snapshot ConfigMap {objects.snapshot_name(run.name)} is missing or is not the one "
            "the operator wrote for this run (owner uid, status.snapshotDigest)"
        )
        return await finishing.finish(
            ctl, run, RunPhase.FAILED, RunReason.SNAPSHOT_MISSING, message, delete_pod=True
        )
    if run.stored.requests:
        await requests.review(ctl, run)
    remaining = attempts.remaining_seconds(run, snapshot.flow_spec)
    if remaining is not None and remaining <= 0:
        message = (
            f"the run exceeded limits.timeoutSeconds={snapshot.flow_spec.limits.timeout_seconds}"
        )
        return await finishing.finish(
            ctl, run, RunPhase.FAILED, RunReason.TIMEOUT, message, delete_pod=True
        )
    requeue = await _follow(ctl, run, snapshot)
    if run.phase is not None and run.phase.terminal:
        return requeue
    await run.save(ctl)
    candidates = [t for t in (requeue, remaining, _RUNNING_RESYNC) if t is not None]
    return min(candidates)


async def _pod(ctl: context.Controller, run: runstate.RunContext, name: str) -> cache.Pod | None:
    """The attempt's pod from the cache; a GET only to be sure before calling it gone."""
    pod = ctl.cache.pod(run.namespace, name)
    if pod is not None:
        return pod
    try:
        found = await ctl.api.get(kube.path_of("pods", run.namespace, name))
    except kube.ApiError as exc:
        if exc.not_found:
            return None
        raise
    ctl.cache.stored(found)
    return ctl.cache.pod(run.namespace, name)


async def _follow(
    ctl: context.Controller, run: runstate.RunContext, snapshot: snapshot_api.Snapshot
) -> float | None:
    """Follow the current attempt: its result, else its pod."""
    result = run.result()
    if result is not None:
        return await _on_result(ctl, run, snapshot, result)
    pod_name = objects.pod_name(run.name, run.attempt)
    attempt = (run.namespace, run.name, run.attempt)
    if run.status.pod_created >= run.attempt:
        ctl.pods_seen.discard(attempt)  # recorded in status: that record is what counts now
    elif attempt not in ctl.pods_seen and ctl.cache.pod(run.namespace, pod_name) is None:
        # reserved, and no pod was ever seen: the operator stopped before creating it
        return await attempts.create_pod(ctl, run, snapshot)
    pod = await _pod(ctl, run, pod_name)
    if pod is None:
        return await _lost(ctl, run, snapshot, f"runner pod {pod_name} is gone")
    if run.status.pod_created < run.attempt:
        ctl.pods_seen.add(attempt)
    if pod.deleting:
        return 2.0
    if pod.phase == "Pending":
        # Pending since the attempt was reserved: nothing to write until the pod runs
        return None
    attempts.mark_created(run, pod_name)
    if pod.phase == "Running":
        message = f"attempt {run.attempt} running in pod {pod_name}"
        run.set_phase(RunPhase.RUNNING, RunReason.RUNNING, message)
        return None
    if pod.phase not in ("Succeeded", "Failed"):
        # Unknown: the node is unreachable and the runner may still run; never start a second
        # runner next to it. The pod's deletion (by whoever evicts it) moves the run on.
        return None
    # The pod ended. The runner writes its result before it exits: that change may still be on
    # its way through the FlowRun watch; look again shortly, then read the run to be sure.
    key = (run.namespace, run.name, run.attempt)
    loop = asyncio.get_running_loop()
    first_seen = ctl.ended_at.setdefault(key, loop.time())
    if loop.time() - first_seen < _RESULT_GRACE_SECONDS:
        return _RESULT_GRACE_SECONDS
    del ctl.ended_at[key]
    run.refresh(await ctl.api.get(run.path), ctl)
    result = run.result()
    if result is not None:
        return await _on_result(ctl, run, snapshot, result)
    why = f"runner pod {pod_name} ended ({pod.ended}) without a result"
    return await _lost(ctl, run, snapshot, why)


async def _on_result(
    ctl: context.Controller,
    run: runstate.RunContext,
    snapshot: snapshot_api.Snapshot,
    result: RunnerResult,
) -> float | None:
    """Act on the runner's result for the current attempt (its usage charged to the Budgets)."""
    await budgets.charge(ctl, run)
    message = result.message or ""
    reason = RunReason.known(result.reason)
    if result.reason and reason is None:
        # a runner of another version may name a reason this one does not: keep its word
        message = f"{result.reason}: {message}" if message else result.reason
    if result.phase is RunPhase.SUCCEEDED:
        return await finishing.finish(
            ctl,
            run,
            RunPhase.SUCCEEDED,
            reason or RunReason.SUCCEEDED,
            message or "the flow finished",
        )
    if result.phase is RunPhase.FAILED:
        reason = reason or RunReason.RUN_FAILED
        return await finishing.finish(ctl, run, RunPhase.FAILED, reason, message or "failed")
    return await _on_waiting(ctl, run, snapshot, message)


async def _on_waiting(
    ctl: context.Controller, run: runstate.RunContext, snapshot: snapshot_api.Snapshot, message: str
) -> float | None:
    """The attempt paused: resume once a request is decided or expired, else wait (Waiting)."""
    decided = requests.resumable(run)
    if decided:
        why = f"request(s) {', '.join(decided)} decided"
        return await attempts.start_next(ctl, run, snapshot, why)
    expired = requests.expired(run.stored)
    if expired:
        requests.mark_expired(ctl, run, expired)
        why = f"request(s) {', '.join(expired)} expired"
        return await attempts.start_next(ctl, run, snapshot, why)
    gone = human_requests.missing(run.stored)
    if gone:
        message = (
            f"node(s) {', '.join(gone)} wait for a request that was deleted from "
            "status.requests: nobody can decide it"
        )
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.REQUEST_MISSING, message)
    undecided = sorted(human_requests.pending(run.stored))
    text = f"waiting for a decision on request(s) {', '.join(undecided) or '(none)'}"
    run.set_phase(RunPhase.WAITING, RunReason.WAITING, message or text)
    return requests.seconds_to_expiry(run.stored)


async def _lost(
    ctl: context.Controller, run: runstate.RunContext, snapshot: snapshot_api.Snapshot, why: str
) -> float | None:
    """The current attempt ended without a result: retry after the backoff, or give up.

    Only lost attempts count against ``retry.maxAttempts`` (with the first attempt), not the
    attempt number: each human decision starts an attempt too, and a loop through an approval
    makes one per iteration. The count, ``status.attemptsLost``, is written with the next
    attempt's reservation or with the end, in the same patch, so a lost attempt counts once.
    """
    retry: flow_api.Retry = snapshot.flow_spec.retry
    lost = run.status.attempts_lost + 1
    if lost >= retry.max_attempts:
        run.status.attempts_lost = lost
        message = (
            f"{why}; {lost} runner attempt(s) lost, retry.maxAttempts={retry.max_attempts} "
            f"allows {retry.max_attempts - 1}"
        )
        return await finishing.finish(
            ctl, run, RunPhase.FAILED, RunReason.RETRIES_EXHAUSTED, message
        )
    key = (run.namespace, run.name, run.attempt)
    loop = asyncio.get_running_loop()
    if key not in ctl.lost_at:
        ctl.lost_at[key] = loop.time()
        run.event(events.WARNING, RunReason.ATTEMPT_LOST, f"attempt {run.attempt}: {why}")
    backoff = retry_policy.Backoff(initial=float(retry.backoff_seconds)).delay(lost)
    left = backoff - (loop.time() - ctl.lost_at[key])
    if left > 0:
        run.set_message(RunReason.ATTEMPT_LOST, f"{why}; attempt {run.attempt + 1} in {left:.0f}s")
        return left
    del ctl.lost_at[key]
    run.status.attempts_lost = lost
    return await attempts.start_next(ctl, run, snapshot, f"retrying after: {why}")
