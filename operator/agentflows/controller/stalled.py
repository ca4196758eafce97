"""A reconcile that retrying cannot fix: said on the object's status and in a Warning Event.

The work queue stops retrying a key whose reconcile raised such an error
(:func:`agentflows.controller.runtime.workqueue.terminal`, controller-runtime's terminal error)
and hands it to :func:`record`, the queue's ``on_terminal`` in :mod:`agentflows.controller.main`:

- a Warning Event ``ReconcileFailed`` on the object (a Flow's history and summary keys name the
  Flow; a Budget's too), which says why and what to do;
- on an Agent, a Flow or a FlowRun whose own key failed, the condition ``Stalled`` True, reason
  ``ReconcileFailed``, with the same message: kstatus (Argo CD, Flux) reads it as "the controller
  is not making progress", and it stays when the Event expires. :func:`clear` removes it after
  the object's next reconcile that passes (an edit, a restart of the operator).

Writing the condition changes the object, so its key is reconciled once more and fails again;
that time the condition already says it, and nothing is posted or written (the queue
logs an ERROR once per key and cause, that pass at DEBUG). A memory's session
retention (``Sessions`` keys) has no object to write on: the queue's log line
is all. Both writes are best effort: the API server refusing them is logged, not raised, so the
queue's worker goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from agentflows.api import API_VERSION, common
from agentflows.controller import cache, conditions, context, events
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: The condition type: kstatus's abnormal-true "the controller cannot make progress".
STALLED = "Stalled"
#: Its reason, and the Event's.
REASON = "ReconcileFailed"
#: Kinds whose own key writes the condition, by plural.
_PLURALS = {workqueue.AGENT: "agents", workqueue.FLOW: "flows", workqueue.FLOWRUN: "flowruns"}
#: Keys that are about another object, by the kind of that object.
_ABOUT = {workqueue.HISTORY: workqueue.FLOW, workqueue.SUMMARY: workqueue.FLOW}


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What the cache holds of the object: its uid, generation and conditions (wire form)."""

    uid: str
    generation: int | None
    conditions: list[dict[str, Any]]


def record(ctl: context.Controller) -> workqueue.TerminalHook:
    """The work queue's ``on_terminal``: the Warning Event, and the ``Stalled`` condition."""

    async def stalled(key: workqueue.Key, exc: BaseException) -> None:
        kind = _ABOUT.get(key.kind, key.kind)
        if kind == workqueue.SESSIONS:
            return
        seen = _cached(ctl, kind, key)
        text = (
            f"{exc}; the operator does not retry this until the {kind} or what it refers to "
            "changes: fix the cause, then edit the object (or delete and re-create it)"
        )
        writes = seen is not None and key.kind in _PLURALS
        if seen is not None and writes:
            said = common.condition_of(seen.conditions, STALLED)
            if said is not None and (said.get("status"), said.get("message")) == ("True", text):
                return  # said already: this reconcile ran again for the condition's own write
        meta = {"namespace": key.namespace, "name": key.name, "uid": seen.uid if seen else ""}
        involved = {"apiVersion": API_VERSION, "kind": kind, "metadata": meta}
        await events.post(ctl.api, involved, events.WARNING, REASON, text)
        if seen is not None and writes:
            wanted = conditions.set_condition(
                seen.conditions, STALLED, "True", REASON, text, generation=seen.generation
            )
            await _write(ctl, key, wanted)

    return stalled


async def clear(ctl: context.Controller, key: workqueue.Key) -> None:
    """Remove the object's ``Stalled`` condition, if it has one (its reconcile just passed)."""
    if key.kind not in _PLURALS or not _says_stalled(ctl, key):
        return  # every passing reconcile asks: the answer is read, not converted
    seen = _cached(ctl, key.kind, key)
    if seen is not None:
        await _write(ctl, key, [c for c in seen.conditions if c.get("type") != STALLED])


def _says_stalled(ctl: context.Controller, key: workqueue.Key) -> bool:
    """Whether the cached object of ``key`` carries the ``Stalled`` condition."""
    if key.kind == workqueue.FLOWRUN:
        run = ctl.cache.run_of(key.namespace, key.name)
        return run is not None and any(c.type == STALLED for c in run.status.conditions)
    seen = _cached(ctl, key.kind, key)
    return seen is not None and common.condition_of(seen.conditions, STALLED) is not None


async def _write(ctl: context.Controller, key: workqueue.Key, wanted: list[dict[str, Any]]) -> None:
    """Write the object's conditions (the operator is their only writer)."""
    path = kube.path_of(_PLURALS[key.kind], key.namespace, key.name, sub="status")
    try:
        stored = await ctl.api.merge_patch(path, context.status_patch({"conditions": wanted}))
    except kube.ApiError as exc:
        log.warning("condition %s of %s not written: %s", STALLED, key, exc)
        return
    ctl.cache.stored(stored)


def _cached(ctl: context.Controller, kind: str, key: workqueue.Key) -> _Seen | None:
    """What the cache holds of the object of ``kind`` named by ``key``, or None."""
    if kind == workqueue.FLOWRUN:
        run = ctl.cache.run_of(key.namespace, key.name)
        if run is None:
            return None
        wire = [c.model_dump(by_alias=True, exclude_none=True) for c in run.status.conditions]
        return _Seen(run.model.metadata.uid or "", run.model.metadata.generation, wire)
    if kind == workqueue.BUDGET:
        budget = ctl.cache.budget(key.namespace, key.name)
        return _Seen(budget.metadata.uid or "", None, []) if budget is not None else None
    found: cache.Spec[Any] | None = None
    if kind == workqueue.AGENT:
        found = ctl.cache.agent(key.namespace, key.name)
    elif kind == workqueue.FLOW:
        found = ctl.cache.flow(key.namespace, key.name)
    if found is None:
        return None
    wire = list((found.obj.get("status") or {}).get("conditions") or [])
    return _Seen(found.uid, found.generation, wire)
