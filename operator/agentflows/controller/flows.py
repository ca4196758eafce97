"""Flow validation and summary: ``Ready``, ``observedGeneration``, ``lastRun``, ``activeRuns``.

Reconciler for keys of kind Flow. A Flow is Ready when its spec parses, its expressions compile
and its graph is sound (:func:`agentflows.engine.graph.validate`), every Agent and sub-flow it
names exists in the namespace, and every Secret it names exists. Otherwise ``Ready`` is False
with one path-named message per problem, joined by ``; ``. A bad Flow is a status, never an
exception: the operator keeps running whatever users apply. Agents re-enqueue the Flows of their
namespace when they change, and a Flow that appears or disappears re-enqueues its neighbours
(sub-flow and ``subFlows`` references).

Triggers (:mod:`agentflows.controller.flowtriggers`): a trigger whose ``input`` or jq ``filter``
does not compile is a Ready problem (``spec.triggers[i].input`` / ``.kubernetes.filter``). A
Ready Flow gets its schedule CronJobs and kubernetes watches synced; ``TriggersReady`` reports
how that went.
"""

from __future__ import annotations

import logging
from typing import Any

from agentflows.api import flow as flow_api
from agentflows.api.flowrun import RunPhase
from agentflows.controller import (
    agents,
    conditions,
    context,
    flowtriggers,
    labels,
    resolve,
    workqueue,
)
from agentflows.engine import graph
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


def is_active(run: dict[str, Any]) -> bool:
    """True for a run that was admitted (has an attempt) and has not finished."""
    status = run.get("status") or {}
    phase = status.get("phase")
    return bool(status.get("attempt")) and not (phase and RunPhase(phase).terminal)


async def runs_of(ctl: context.Controller, namespace: str, flow: str) -> list[dict[str, Any]]:
    """The FlowRuns of one Flow, listed by label so the cost does not grow with other Flows' runs.

    Every run is labelled ``agentflows.io/flow`` before it is admitted (flowruns.py), so a run
    without the label has not been admitted yet and cannot be active; ``spec.flow`` is checked
    too, in case someone set the label by hand.
    """
    listed = await ctl.api.get(
        kube.path_of("flowruns", namespace), labelSelector=f"{labels.FLOW}={flow}"
    )
    return [r for r in listed.get("items", []) if (r.get("spec") or {}).get("flow") == flow]


async def run_summary(ctl: context.Controller, namespace: str, flow: str) -> dict[str, Any]:
    """``lastRun`` and ``activeRuns`` of a Flow."""
    runs = await runs_of(ctl, namespace, flow)
    summary: dict[str, Any] = {"activeRuns": sum(1 for r in runs if is_active(r))}
    if runs:
        newest = max(
            runs, key=lambda r: (r["metadata"].get("creationTimestamp", ""), r["metadata"]["name"])
        )
        summary["lastRun"] = newest["metadata"]["name"]
    return summary


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Validate one Flow and summarise its runs."""
    path = kube.path_of("flows", key.namespace, key.name)
    try:
        obj = await ctl.api.get(path)
    except kube.ApiError as exc:
        if exc.not_found:
            await ctl.triggers.forget(key.namespace, key.name)
            await _enqueue_neighbours(ctl, key)
            return None
        raise
    spec, problems = resolve.parse_spec(flow_api.FlowSpec, obj.get("spec"))
    if spec is not None:
        ns = await resolve.load_namespace(ctl.api, key.namespace)
        problems = graph.validate(spec, ns.resolver(), name=key.name)
        refs = resolve.flow_secret_refs(spec) + resolve.trigger_secret_refs(spec)
        problems += await resolve.missing_secrets(ctl.api, key.namespace, refs)
    status = agents.ready_status(obj, problems, await run_summary(ctl, key.namespace, key.name))
    if problems:
        has_triggers = bool((obj.get("spec") or {}).get("triggers"))
        outcome = await ctl.triggers.suspend(key.namespace, key.name, has_triggers=has_triggers)
    else:
        outcome = await ctl.triggers.sync(ctl.api, obj)
    status["conditions"] = conditions.set_condition(
        status["conditions"],
        flowtriggers.TRIGGERS_READY,
        outcome.status,
        outcome.reason,
        outcome.message,
        generation=status["observedGeneration"],
    )
    if not agents.unchanged(obj, status):
        await ctl.api.merge_patch(path + "/status", context.status_patch(status))
        log.info("Flow %s/%s Ready=%s", key.namespace, key.name, not problems)
    if (obj.get("status") or {}).get("observedGeneration") is None:
        await _enqueue_neighbours(ctl, key)
    if outcome.retry is not None:
        raise outcome.retry
    if problems or outcome.status != "True":
        return ctl.config.not_ready_recheck_seconds
    return None


async def _enqueue_neighbours(ctl: context.Controller, key: workqueue.Key) -> None:
    """A Flow appeared or disappeared: Agents and Flows naming it may change readiness."""
    for plural, kind in (("flows", workqueue.FLOW), ("agents", workqueue.AGENT)):
        for item in (await ctl.api.get(kube.path_of(plural, key.namespace))).get("items", []):
            name = item["metadata"]["name"]
            if (kind, name) != (key.kind, key.name):
                ctl.enqueue(kind, key.namespace, name)
