"""The end of a run: the terminal transition, TTL after finishing, and history limits.

:func:`finish` is the one place a run becomes Succeeded, Failed or Cancelled: it writes the
phase (and, for cancellation and timeouts, deletes the runner pod), observes the run's metrics
once, and wakes the Flow's queued runs. :func:`after_finished` deletes a finished run when the
Flow's ``ttlSecondsAfterFinished`` has passed; :func:`enforce_history` (key kind History) keeps
only the newest ``successfulRunsHistoryLimit`` / ``failedRunsHistoryLimit`` finished runs.
"""

from __future__ import annotations

import logging
from typing import Any

import pydantic

from agentflows.api import flow as flow_api
from agentflows.api.flowrun import RunPhase
from agentflows.controller import (
    attempts,
    conditions,
    context,
    flows,
    runstate,
    snapshots,
    workqueue,
)
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


async def finish(
    ctl: context.Controller,
    run: runstate.RunContext,
    phase: RunPhase,
    reason: str,
    message: str,
    *,
    delete_pod: bool = False,
) -> float | None:
    """Make the run terminal; return when to look again (its TTL)."""
    if delete_pod and run.get("pod"):
        await ctl.api.delete(kube.path_of("pods", run.namespace, run.get("pod")), grace_seconds=5)
    run.set_phase(phase, reason, message)
    await run.save(ctl)
    snapshot = await snapshots.read(ctl.api, run.namespace, run.name)
    flow_spec = None
    models: dict[str, str] = {}
    if snapshot:
        flow_spec, _, agent_specs = snapshots.specs(snapshot)
        models = attempts.agent_models(agent_specs)
    ctl.metrics.run_finished(run.namespace, run.flow, phase.value, run.status, flow_spec, models)
    if flow_spec is None or flow_spec.concurrency.policy is flow_api.ConcurrencyPolicy.QUEUE:
        await wake_queued(ctl, run.namespace, run.flow)
    ctl.enqueue(workqueue.HISTORY, run.namespace, run.flow)
    return await after_finished(ctl, run)


async def wake_queued(ctl: context.Controller, namespace: str, flow: str) -> None:
    """Enqueue the Flow's runs that have not started, so a freed slot is taken."""
    for item in await flows.runs_of(ctl, namespace, flow):
        status = item.get("status") or {}
        if not status.get("attempt"):
            ctl.enqueue(workqueue.FLOWRUN, namespace, item["metadata"]["name"])


async def live_flow(ctl: context.Controller, namespace: str, name: str) -> flow_api.FlowSpec | None:
    """The Flow as it is now (history and TTL are the Flow's current policy), if it parses."""
    try:
        obj = await ctl.api.get(kube.path_of("flows", namespace, name))
        return flow_api.FlowSpec.model_validate(obj.get("spec") or {})
    except kube.ApiError as exc:
        if exc.not_found:
            return None
        raise
    except pydantic.ValidationError:
        return None


async def after_finished(ctl: context.Controller, run: runstate.RunContext) -> float | None:
    """Delete the run once its TTL has passed; else return the seconds left."""
    spec = await live_flow(ctl, run.namespace, run.flow)
    if spec is None:
        snapshot = await snapshots.read(ctl.api, run.namespace, run.name)
        spec = snapshots.specs(snapshot)[0] if snapshot else None
    ttl = spec.ttl_seconds_after_finished if spec else None
    finished = conditions.parse_time(run.get("completionTime"))
    if ttl is None or finished is None:
        return None
    left = ttl - (conditions.now() - finished).total_seconds()
    if left > 0:
        return left
    log.info("FlowRun %s/%s: ttlSecondsAfterFinished passed; deleting", run.namespace, run.name)
    await ctl.api.delete(run.path, propagation="Background")
    return None


def _finished_at(item: dict[str, Any]) -> str:
    status = item.get("status") or {}
    return str(status.get("completionTime") or item["metadata"].get("creationTimestamp", ""))


async def enforce_history(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Delete a Flow's oldest finished runs beyond its history limits."""
    spec = await live_flow(ctl, key.namespace, key.name)
    if spec is None:
        return None
    finished: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for item in await flows.runs_of(ctl, key.namespace, key.name):
        phase = (item.get("status") or {}).get("phase")
        if not phase:
            continue
        if RunPhase(phase).terminal:
            finished[phase == RunPhase.SUCCEEDED.value].append(item)
    limits = {True: spec.successful_runs_history_limit, False: spec.failed_runs_history_limit}
    for succeeded, items in finished.items():
        items.sort(key=_finished_at, reverse=True)
        for item in items[limits[succeeded] :]:
            name = item["metadata"]["name"]
            log.info("FlowRun %s/%s: beyond the history limit; deleting", key.namespace, name)
            await ctl.api.delete(
                kube.path_of("flowruns", key.namespace, name), propagation="Background"
            )
    return None
