"""Starting a run: resolve and snapshot its Flow, apply the concurrency policy, first attempt.

Called by :mod:`agentflows.controller.flowruns` for a run with no attempt yet. Per Flow, one
admission runs at a time (``Controller.flow_lock``), and an admitted run has ``status.attempt``
written before the lock is released, so concurrent admissions see each other. Policies (over the
Flow's runs that were admitted and have not finished, "active"):

- Allow: always start.
- Forbid: with ``max`` active runs, the new run is Cancelled with reason ConcurrencyForbid.
- Replace: the oldest active runs get ``spec.cancel: true`` until fewer than ``max`` remain;
  the new run starts at once.
- Queue: the run is Queued until fewer than ``max`` runs are active and it is among the oldest
  waiting runs (oldest first, by creation time then name).
"""

from __future__ import annotations

import enum
from typing import Any

from agentflows.api import flow as flow_api
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import attempts, finishing, flows, resolve, runstate, snapshots
from agentflows.controller import context as context_mod
from agentflows.engine import graph
from agentflows.kube import client as kube


class Admission(enum.Enum):
    """What the concurrency policy says about a new run."""

    START = "start"
    QUEUE = "queue"
    FORBID = "forbid"


def _age(item: dict[str, Any]) -> tuple[str, str]:
    return (item["metadata"].get("creationTimestamp", ""), item["metadata"]["name"])


def _waiting(item: dict[str, Any]) -> bool:
    status = item.get("status") or {}
    phase = status.get("phase")
    return (
        not status.get("attempt")
        and not (phase and RunPhase(phase).terminal)
        and not (item.get("spec") or {}).get("cancel")
    )


async def decide(
    ctl: context_mod.Controller, run: runstate.RunContext, spec: flow_api.FlowSpec
) -> Admission:
    """Apply the Flow's concurrency policy to ``run``."""
    policy = spec.concurrency.policy
    if policy is flow_api.ConcurrencyPolicy.ALLOW:
        return Admission.START
    limit = spec.concurrency.max
    items = [
        item
        for item in await flows.runs_of(ctl, run.namespace, run.flow)
        if item["metadata"]["name"] != run.name
    ]
    active = sorted((item for item in items if flows.is_active(item)), key=_age)
    if policy is flow_api.ConcurrencyPolicy.FORBID:
        return Admission.FORBID if len(active) >= limit else Admission.START
    if policy is flow_api.ConcurrencyPolicy.REPLACE:
        for victim in active[: max(0, len(active) - limit + 1)]:
            if not (victim.get("spec") or {}).get("cancel"):
                name = victim["metadata"]["name"]
                path = kube.path_of("flowruns", run.namespace, name)
                await ctl.api.merge_patch(path, {"spec": {"cancel": True}})
                run.event("Normal", "Replaced", f"cancelled active run {name} (policy Replace)")
        return Admission.START
    waiting = sorted([*(item for item in items if _waiting(item)), run.obj], key=_age)
    slots = limit - len(active)
    names = [item["metadata"]["name"] for item in waiting[: max(0, slots)]]
    return Admission.START if run.name in names else Admission.QUEUE


async def start(ctl: context_mod.Controller, run: runstate.RunContext) -> float | None:
    """Admit a new run and create its first pod, or queue, forbid or fail it."""
    try:
        await ctl.api.get(kube.path_of("flows", run.namespace, run.flow))
    except kube.ApiError as exc:
        if not exc.not_found:
            raise
        message = f'Flow "{run.flow}" does not exist in namespace {run.namespace}'
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.FLOW_NOT_FOUND, message)
    ns = await resolve.load_namespace(ctl.api, run.namespace)
    spec = ns.flows.get(run.flow)
    if spec is None:
        message = f'Flow "{run.flow}" does not parse; see its Ready condition'
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.FLOW_INVALID, message)
    problems = [str(p) for p in graph.validate(spec, ns.resolver(), name=run.flow)]
    problems += [f"{name} does not exist" for name in resolve.reach(run.flow, ns).missing]
    if problems:
        message = "; ".join(problems)
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.FLOW_INVALID, message)
    if spec.concurrency.policy is flow_api.ConcurrencyPolicy.ALLOW:
        # nothing to count: runs of an Allow Flow never wait on each other's admission
        return await _begin(ctl, run, ns)
    # the lock covers counting active runs through saving this run's decision, so two runs of
    # a Forbid/Queue/Replace Flow cannot both take the last slot
    async with ctl.flow_lock(run.namespace, run.flow):
        admission = await decide(ctl, run, spec)
        if admission is Admission.FORBID:
            message = (
                f"Flow {run.flow} allows {spec.concurrency.max} active run(s) "
                "(concurrency policy Forbid)"
            )
            return await finishing.finish(
                ctl, run, RunPhase.CANCELLED, RunReason.CONCURRENCY_FORBID, message
            )
        if admission is Admission.QUEUE:
            message = f"queued: Flow {run.flow} allows {spec.concurrency.max} active run(s)"
            run.set_phase(RunPhase.QUEUED, RunReason.QUEUED, message)
            await run.save(ctl)
            return ctl.config.resync_seconds
        return await _begin(ctl, run, ns)


async def _begin(
    ctl: context_mod.Controller, run: runstate.RunContext, ns: resolve.Namespace
) -> float | None:
    """Snapshot the Flow and its Agents as they are now, then start attempt 1."""
    snapshot = await snapshots.ensure(ctl.api, run.obj, snapshots.document(run.flow, ns))
    run.reserve_attempt(1)
    run.set_phase(RunPhase.PENDING, RunReason.ATTEMPT_STARTED, "attempt 1: starting the runner pod")
    await run.save(ctl)
    return await attempts.create_pod(ctl, run, snapshot)
