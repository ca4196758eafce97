"""Flow validation and summary: ``Ready``, ``observedGeneration``, ``lastRun``, ``activeRuns``.

Reconciler for keys of kind Flow and Summary, reading from the cache. A Flow is Ready when its
spec parses, its expressions compile and its graph is sound
(:func:`agentflows.engine.graph.validate`), every Agent and sub-flow it reaches exists in the
namespace, and every Secret it names exists. Otherwise ``Ready`` is False with one path-named
message per problem, joined by ``; ``. A bad Flow is a status, never an exception: the operator
keeps running whatever users apply.

Validation runs when the Flow or something it reaches changes (the cache enqueues the Flows that
reach a changed Agent or Flow), for that Flow only: its result is kept with what it was computed
from (:func:`validation_key`), so a reconcile caused by anything else costs no validation and no
API request. Secrets are not watched: a Flow that is not Ready is validated again every
``notReadyRecheckSeconds``.

Triggers (:mod:`agentflows.controller.flowtriggers`): a trigger whose ``input`` or jq ``filter``
does not compile is a Ready problem. A Ready Flow's schedule CronJobs and kubernetes watches are
synced when it is validated; ``TriggersReady`` reports how that went.

The summary (``activeRuns``, ``lastRun``) is the Summary key's work: the cache enqueues it, at
most once a second, when a run of the Flow starts, changes phase, or goes; it is written only
when it changed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from agentflows.api import common, documents
from agentflows.api import flow as flow_api
from agentflows.controller import agents, cache, conditions, context, flowtriggers, resolve
from agentflows.controller.runtime import workqueue
from agentflows.engine import graph
from agentflows.kube import client as kube

log = logging.getLogger(__name__)


def is_active(run: cache.Run) -> bool:
    """True for a run that was admitted (has an attempt) and has not finished."""
    phase = run.status.phase
    return bool(run.status.attempt) and not (phase is not None and phase.terminal)


def summary(ctl: context.Controller, namespace: str, flow: str) -> dict[str, Any]:
    """``activeRuns`` and ``lastRun`` of a Flow, from the cache."""
    runs = ctl.cache.runs_of(namespace, flow)
    result: dict[str, Any] = {"activeRuns": sum(1 for r in runs if is_active(r))}
    if runs:
        newest = max(
            runs,
            key=lambda r: (
                r.obj["metadata"].get("creationTimestamp", ""),
                r.obj["metadata"]["name"],
            ),
        )
        result["lastRun"] = newest.obj["metadata"]["name"]
    return result


def validation_key(ctl: context.Controller, namespace: str, name: str) -> tuple[Any, ...]:
    """What a Flow's validation depends on: the uid and generation of all it reaches."""
    reach = resolve.reach(name, ctl.cache.namespace(namespace))
    parts: list[tuple[str, ...]] = []
    for kind, names in (("Flow", reach.flows), ("Agent", reach.agents)):
        for each in sorted(names):
            found = (
                ctl.cache.flow(namespace, each)
                if kind == "Flow"
                else ctl.cache.agent(namespace, each)
            )
            if found is not None:
                parts.append((kind, each, found.uid, str(found.generation)))
    return (*parts, *(("missing", m) for m in sorted(reach.missing)))


@dataclasses.dataclass
class _Validated:
    key: tuple[Any, ...]
    graph: list[documents.Problem]
    problems: list[documents.Problem] | None = None
    checked_at: float = 0.0
    triggers: flowtriggers.Outcome | None = None


def _validated(ctl: context.Controller, namespace: str, name: str) -> _Validated:
    """The Flow's graph problems for what it reaches now (computed once per version)."""
    key = validation_key(ctl, namespace, name)
    memo_key = (workqueue.FLOW, namespace, name)
    known = ctl.validated.get(memo_key)
    if isinstance(known, _Validated) and known.key == key:
        return known
    ns = ctl.cache.namespace(namespace)
    spec = ns.flows[name]
    found = graph.validate(spec, ns.resolver(), name=name)
    found += [
        documents.Problem("spec", f"{missing} does not exist")
        for missing in resolve.reach(name, ns).missing
    ]
    fresh = _Validated(key, found)
    ctl.validated[memo_key] = fresh
    ctl.metrics.validations.labels(workqueue.FLOW).inc()
    log.info("validated Flow %s/%s: %d problem(s)", namespace, name, len(found))
    return fresh


def graph_problems(ctl: context.Controller, namespace: str, name: str) -> list[documents.Problem]:
    """Why a parsed Flow cannot run, from the cache (empty when it can)."""
    return _validated(ctl, namespace, name).graph


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Validate one Flow when it or what it reaches changed, and sync its triggers."""
    flow = ctl.cache.flow(key.namespace, key.name)
    if flow is None or flow.spec is None:
        ctl.validated.pop((workqueue.FLOW, key.namespace, key.name), None)
    if flow is None:
        await ctl.triggers.forget(key.namespace, key.name)
        return None
    if flow.spec is None:
        problems = list(flow.problems)
        has_triggers = bool((flow.obj.get("spec") or {}).get("triggers"))
        outcome = await ctl.triggers.suspend(key.namespace, key.name, has_triggers=has_triggers)
    else:
        problems, outcome = await _check(ctl, flow)
    await _write(ctl, flow, problems, outcome)
    if outcome.retry is not None:
        raise outcome.retry
    if problems or outcome.status != "True":
        return ctl.config.not_ready_recheck_seconds
    return None


async def _check(
    ctl: context.Controller, flow: cache.Spec[flow_api.FlowSpec]
) -> tuple[list[documents.Problem], flowtriggers.Outcome]:
    """A parsed Flow's problems and triggers, from the last validation unless it is stale."""
    assert flow.spec is not None
    namespace = str(flow.obj["metadata"]["namespace"])
    memo = _validated(ctl, namespace, flow.name)
    since = time.monotonic() - memo.checked_at
    if memo.problems is None or (memo.problems and since >= ctl.config.not_ready_recheck_seconds):
        refs = resolve.flow_secret_refs(flow.spec) + resolve.trigger_secret_refs(flow.spec)
        missing = await resolve.missing_secrets(ctl.api, namespace, refs)
        memo.problems = memo.graph + missing
        memo.checked_at = time.monotonic()
        memo.triggers = None
    triggers = memo.triggers
    if triggers is None or triggers.retry is not None or triggers.status != "True":
        if memo.problems:
            has_triggers = bool(flow.spec.triggers)
            triggers = await ctl.triggers.suspend(namespace, flow.name, has_triggers=has_triggers)
        else:
            triggers = await ctl.triggers.sync(ctl.api, flow.obj)
        memo.triggers = triggers
    return list(memo.problems), triggers


async def _write(
    ctl: context.Controller,
    flow: cache.Spec[Any],
    problems: list[documents.Problem],
    outcome: flowtriggers.Outcome,
) -> None:
    """Write Ready, TriggersReady, TriggersRefused and observedGeneration when they changed."""
    obj = flow.obj
    status = agents.ready_status(obj, problems, {})
    status["conditions"] = conditions.set_condition(
        status["conditions"],
        flowtriggers.TRIGGERS_READY,
        outcome.status,
        outcome.reason,
        outcome.message,
        generation=status["observedGeneration"],
    )
    refused = ctl.triggers.manager.refused(obj)
    if refused or common.condition_of(status["conditions"], flowtriggers.TRIGGERS_REFUSED):
        status["conditions"] = conditions.set_condition(
            status["conditions"],
            flowtriggers.TRIGGERS_REFUSED,
            "True" if refused else "False",
            "TriggerRefused" if refused else "NoneRefused",
            "; ".join(refused),
            generation=status["observedGeneration"],
        )
    if not agents.unchanged(obj, status):
        meta = obj["metadata"]
        path = kube.path_of("flows", meta["namespace"], meta["name"], sub="status")
        ctl.cache.stored(await ctl.api.merge_patch(path, context.status_patch(status)))
        log.info("Flow %s/%s Ready=%s", meta["namespace"], meta["name"], not problems)


async def summarize(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Write a Flow's ``activeRuns`` and ``lastRun`` when they changed."""
    flow = ctl.cache.flow(key.namespace, key.name)
    if flow is None:
        return None
    wanted = summary(ctl, key.namespace, key.name)
    if not agents.unchanged(flow.obj, wanted):
        path = kube.path_of("flows", key.namespace, key.name, sub="status")
        ctl.cache.stored(await ctl.api.merge_patch(path, context.status_patch(wanted)))
    return None
