"""Starting a run: resolve and snapshot its Flow, apply the concurrency policy, first attempt.

Called by :mod:`agentflows.controller.flowruns` for a run with no attempt yet; reads the Flow,
what it reaches and its runs from the cache. Per Flow, one
admission runs at a time (``Controller.flow_lock``), and an admitted run has ``status.attempt``
written before the lock is released, so concurrent admissions see each other. Policies (over the
Flow's runs that were admitted and have not finished, "active"):

- Allow: always start.
- Forbid: with ``max`` active runs, the new run is Cancelled with reason ConcurrencyForbid.
- Replace: the oldest active runs get ``spec.cancel: true`` until fewer than ``max`` remain;
  the new run starts at once.
- Queue: the run is Queued until fewer than ``max`` runs are active and it is among the oldest
  waiting runs (oldest first, by creation time then name).

Before the policy, the namespace's Budgets (:mod:`agentflows.controller.budgets`): a used-up
one holds the run Pending (reason BudgetExceeded) or, with policy Refuse, fails it.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import attempts, budgets, cache, finishing, flows, resolve, runstate
from agentflows.controller import context as context_mod
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


class Admission(enum.Enum):
    """What the concurrency policy says about a new run."""

    START = "start"
    QUEUE = "queue"
    FORBID = "forbid"


def _age(run: cache.Run) -> tuple[str, str]:
    meta = run.obj["metadata"]
    return (str(meta.get("creationTimestamp", "")), str(meta["name"]))


def _waiting(run: cache.Run) -> bool:
    phase = run.status.phase
    return (
        not run.status.attempt
        and not (phase is not None and phase.terminal)
        and not run.model.spec.cancel
    )


async def decide(
    ctl: context_mod.Controller, run: runstate.RunContext, spec: flow_api.FlowSpec
) -> Admission:
    """Apply the Flow's concurrency policy to ``run``."""
    policy = spec.concurrency.policy
    if policy is flow_api.ConcurrencyPolicy.ALLOW:
        return Admission.START
    limit = spec.concurrency.max
    others = [
        r
        for r in ctl.cache.runs_of(run.namespace, run.flow)
        if r.obj["metadata"]["name"] != run.name
    ]
    active = sorted((r for r in others if flows.is_active(r)), key=_age)
    if policy is flow_api.ConcurrencyPolicy.FORBID:
        return Admission.FORBID if len(active) >= limit else Admission.START
    if policy is flow_api.ConcurrencyPolicy.REPLACE:
        for victim in active[: max(0, len(active) - limit + 1)]:
            if not victim.model.spec.cancel:
                name = victim.obj["metadata"]["name"]
                path = kube.path_of("flowruns", run.namespace, name)
                ctl.cache.stored(await ctl.api.merge_patch(path, {"spec": {"cancel": True}}))
                run.event("Normal", "Replaced", f"cancelled active run {name} (policy Replace)")
        return Admission.START
    me = ctl.cache.run_of(run.namespace, run.name)
    waiting = sorted([*(r for r in others if _waiting(r)), *([me] if me else [])], key=_age)
    slots = limit - len(active)
    names = [r.obj["metadata"]["name"] for r in waiting[: max(0, slots)]]
    return Admission.START if run.name in names else Admission.QUEUE


_PLURALS = {"Flow": "flows", "Agent": "agents"}


def _held(ctl: context_mod.Controller, namespace: str, ref: str) -> bool:
    """Whether the cache holds ``Kind/name`` in any form (one that does not parse is held)."""
    kind, _, name = ref.partition("/")
    if kind == "Flow":
        return ctl.cache.flow(namespace, name) is not None
    return kind != "Agent" or ctl.cache.agent(namespace, name) is not None


async def catch_up(ctl: context_mod.Controller, namespace: str, flow: str) -> list[str]:
    """Read from the API what the Flow reaches and the cache lacks; return what was found.

    Watches of different kinds are not ordered: a FlowRun applied in one file with its Flow and
    Agents may reach the cache first. A run is failed for a missing Flow or Agent only once the
    API server itself answers 404; one GET per missing name, and only when one is missing.
    """
    found: list[str] = []
    asked: set[str] = set()
    while True:
        missing = resolve.reach(flow, ctl.cache.namespace(namespace)).missing
        todo = [m for m in missing if m not in asked and not _held(ctl, namespace, m)]
        if not todo:
            return found
        for ref in todo:
            asked.add(ref)
            kind, _, name = ref.partition("/")
            try:
                obj = await ctl.api.get(kube.path_of(_PLURALS[kind], namespace, name))
            except kube.ApiError as exc:
                if exc.not_found:
                    continue
                raise
            ctl.cache.stored(obj)
            found.append(ref)
            log.info("%s/%s was not in the cache yet: read from the API server", namespace, ref)


async def start(ctl: context_mod.Controller, run: runstate.RunContext) -> float | None:
    """Admit a new run and create its first pod, or queue, forbid or fail it."""
    too_large = flowrun_api.input_size_problem((run.obj.get("spec") or {}).get("input"))
    if too_large is not None:
        reason = RunReason.INPUT_TOO_LARGE
        return await finishing.finish(ctl, run, RunPhase.FAILED, reason, too_large)
    await catch_up(ctl, run.namespace, run.flow)
    flow = ctl.cache.flow(run.namespace, run.flow)
    if flow is None:
        message = f'Flow "{run.flow}" does not exist in namespace {run.namespace}'
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.FLOW_NOT_FOUND, message)
    spec = flow.spec
    if spec is None:
        message = f'Flow "{run.flow}" does not parse; see its Ready condition'
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.FLOW_INVALID, message)
    problems = [str(p) for p in flows.graph_problems(ctl, run.namespace, run.flow)]
    if problems:
        message = "; ".join(problems)
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.FLOW_INVALID, message)
    over_budget = budgets.over(ctl, run)
    if over_budget:
        refused = budgets.refusal(over_budget)
        if refused is None:
            return await budgets.hold(ctl, run, over_budget)
        return await finishing.finish(ctl, run, RunPhase.FAILED, RunReason.BUDGET_EXCEEDED, refused)
    if spec.concurrency.policy is flow_api.ConcurrencyPolicy.ALLOW:
        # nothing to count: runs of an Allow Flow never wait on each other's admission
        return await _begin(ctl, run)
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
        return await _begin(ctl, run)


async def _begin(ctl: context_mod.Controller, run: runstate.RunContext) -> float | None:
    """Snapshot the Flow and its Agents as they are now, then start attempt 1.

    The snapshot ConfigMap is written first: once ``status.attempt`` is stored, a restarted
    operator (or a runner) expects the snapshot to exist, so nothing may refer to it before it
    does. The attempt's status and the pod are then written at the same time: the runner may
    write only once ``status.pod`` names its pod, and a pod takes far longer to start than the
    status write. A write that fails is retried by the next reconcile (the snapshot's and the
    pod's fixed names make both creates idempotent; a snapshot left by an admission that died
    half-way is kept when it holds what was built now, replaced otherwise: no runner has read it).
    ``status.snapshotDigest`` goes with the attempt: later readers use only that content.
    """
    snapshot = await ctl.snapshots.ensure(
        ctl.api, run.obj, ctl.snapshots.build(run.namespace, run.flow)
    )
    run.reserve_attempt(1)
    run.status.snapshot_digest = snapshot.digest
    run.set_phase(RunPhase.PENDING, RunReason.ATTEMPT_STARTED, "attempt 1: starting the runner pod")
    body = attempts.pod_body(ctl, run, snapshot)
    _, refusal = await asyncio.gather(
        run.save(ctl), attempts.post_attempt(ctl, run, snapshot, body)
    )
    return await attempts.created(ctl, run, body, refusal)
