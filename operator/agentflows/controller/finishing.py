"""The end of a run: the terminal transition, TTL after finishing, and history limits.

:func:`finish` is the one place a run becomes Succeeded, Failed or Cancelled: it writes the
phase (and, for cancellation and timeouts, deletes the runner pod), observes the run's metrics
once, exports the run's own trace span (:mod:`agentflows.tracing`), asks for retention of the
memories its turns may have written (:mod:`agentflows.controller.retention`), and wakes the
Flow's queued runs. :func:`after_finished` deletes a finished run when the
Flow's ``ttlSecondsAfterFinished`` has passed; :func:`enforce_history` (key kind History) keeps
only the newest ``successfulRunsHistoryLimit`` / ``failedRunsHistoryLimit`` finished runs.
"""

from __future__ import annotations

import logging

from agentflows import tracing
from agentflows.api import flow as flow_api
from agentflows.api import times, wellknown
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import attempts, cache, context, retention, runstate
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


async def finish(
    ctl: context.Controller,
    run: runstate.RunContext,
    phase: RunPhase,
    reason: RunReason,
    message: str,
    *,
    delete_pod: bool = False,
) -> float | None:
    """Make the run terminal; return when to look again (its TTL)."""
    if delete_pod and run.status.pod:
        path = kube.path_of("pods", run.namespace, run.status.pod)
        await ctl.api.delete(path, grace_seconds=5)
    run.set_phase(phase, reason, message)
    await run.save(ctl)
    _record_span(run, phase, reason)
    snapshot = await ctl.snapshots.of_run(ctl.api, run.obj) if run.attempt else None
    flow_spec = snapshot.flow_spec if snapshot else None
    models = attempts.agent_models(snapshot.agent_specs) if snapshot else {}
    if snapshot is not None:
        retention.note(ctl, run.namespace, snapshot)
    ctl.metrics.run_finished(run.namespace, run.flow, phase.value, run.status, flow_spec, models)
    ctl.snapshots.forget(run.namespace, run.name)
    ctl.pods_seen.discard((run.namespace, run.name, run.attempt))
    if flow_spec is None or flow_spec.concurrency.policy is flow_api.ConcurrencyPolicy.QUEUE:
        wake_queued(ctl, run.namespace, run.flow)
    ctl.enqueue(workqueue.HISTORY, run.namespace, run.flow)
    return await after_finished(ctl, run)


def _record_span(run: runstate.RunContext, phase: RunPhase, reason: RunReason) -> None:
    """Export the run's own span, parent of its attempts' (no-op unless tracing is on)."""
    meta = run.obj["metadata"]
    started = times.parse_time(meta.get("creationTimestamp")) or times.now()
    ended = times.parse_time(run.status.completion_time) or times.now()
    tracing.record_run(
        run.uid,
        (meta.get("annotations") or {}).get(wellknown.TRACEPARENT_ANNOTATION),
        f"flowrun {run.name}",
        {
            "agentflows.run.name": run.name,
            "agentflows.run.namespace": run.namespace,
            "agentflows.flow.name": run.flow,
            "agentflows.run.phase": phase.value,
            "agentflows.run.reason": reason,
            "agentflows.run.attempts": run.attempt,
        },
        int(started.timestamp() * 1e9),
        int(max(ended, started).timestamp() * 1e9),
    )


def wake_queued(ctl: context.Controller, namespace: str, flow: str) -> None:
    """Enqueue the Flow's runs that have not started, so a freed slot is taken."""
    for item in ctl.cache.runs_of(namespace, flow):
        if not item.status.attempt:
            ctl.enqueue(workqueue.FLOWRUN, namespace, item.obj["metadata"]["name"])


def live_flow(ctl: context.Controller, namespace: str, name: str) -> flow_api.FlowSpec | None:
    """The Flow as it is now (history and TTL are the Flow's current policy), if it parses."""
    found = ctl.cache.flow(namespace, name)
    return found.spec if found is not None else None


async def after_finished(ctl: context.Controller, run: runstate.RunContext) -> float | None:
    """Delete the run once its TTL has passed; else return the seconds left."""
    spec = live_flow(ctl, run.namespace, run.flow)
    if spec is None and ctl.cache.flow(run.namespace, run.flow) is None:
        snapshot = await ctl.snapshots.of_run(ctl.api, run.obj) if run.attempt else None
        ctl.snapshots.forget(run.namespace, run.name)
        spec = snapshot.flow_spec if snapshot else None
    ttl = spec.ttl_seconds_after_finished if spec else None
    finished = times.parse_time(run.status.completion_time)
    if ttl is None or finished is None:
        return None
    left = ttl - (times.now() - finished).total_seconds()
    if left > 0:
        return left
    log.info("FlowRun %s/%s: ttlSecondsAfterFinished passed; deleting", run.namespace, run.name)
    await ctl.api.delete(run.path, propagation="Background")
    return None


def _finished_at(run: cache.Run) -> tuple[str, str, str]:
    """Newest first by completion, then creation (times have whole seconds), then name."""
    meta = run.obj["metadata"]
    created = str(meta.get("creationTimestamp", ""))
    return (str(run.status.completion_time or created), created, str(meta["name"]))


async def enforce_history(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Delete a Flow's oldest finished runs beyond its history limits."""
    spec = live_flow(ctl, key.namespace, key.name)
    if spec is None:
        return None
    finished: dict[bool, list[cache.Run]] = {True: [], False: []}
    for run in ctl.cache.runs_of(key.namespace, key.name):
        phase = run.status.phase
        if phase is not None and phase.terminal:
            finished[phase is RunPhase.SUCCEEDED].append(run)
    limits = {True: spec.successful_runs_history_limit, False: spec.failed_runs_history_limit}
    for succeeded, runs in finished.items():
        runs.sort(key=_finished_at, reverse=True)
        for run in runs[limits[succeeded] :]:
            name = run.obj["metadata"]["name"]
            log.info("FlowRun %s/%s: beyond the history limit; deleting", key.namespace, name)
            await ctl.api.delete(
                kube.path_of("flowruns", key.namespace, name),
                propagation="Background",
                missing_ok=True,
            )
    return None
