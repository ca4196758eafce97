"""A Flow's triggers in the operator: expression checks, schedule CronJobs, kubernetes watches.

Called by :mod:`agentflows.controller.flows` on every Flow reconcile. One :class:`FlowTriggers`
is built by :mod:`agentflows.controller.main` and lives as long as the operator: it owns the
:class:`~agentflows.triggers.kubernetes.WatchManager` and an in-memory index of the Ready Flows
that have ``kubernetes`` triggers, handed to the manager whenever it changes. The index is a
cache: after a restart the operator reconciles every Flow it lists and rebuilds it.

A Flow that is not Ready (a bad trigger expression included) has its watches stopped and its
CronJobs left as they are until it is fixed; a Flow that goes away loses its watches here and
its CronJobs through their ownerReference. The outcome is the Flow's ``TriggersReady``
condition; trigger errors never escape as exceptions, except a retryable API error, which the
work queue retries with backoff after the condition is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from agentflows.api import wellknown
from agentflows.controller import cache
from agentflows.kube import client as kube
from agentflows.triggers import common, kubernetes, schedule

#: The Flow condition that says whether its CronJobs and watches match its triggers.
TRIGGERS_READY = "TriggersReady"
#: The Flow condition, present once a trigger of this generation refused a delivery as a loop
#: or was suspended (its filter hit a bound): True with every reason, until the Flow changes.
TRIGGERS_REFUSED = "TriggersRefused"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The ``TriggersReady`` condition of one Flow, and an API error worth retrying."""

    status: str
    reason: str
    message: str = ""
    retry: kube.ApiError | None = None


def _watch_fingerprint(flow_obj: Mapping[str, Any] | None) -> str | None:
    if flow_obj is None:
        return None
    triggers = (flow_obj.get("spec") or {}).get("triggers") or []
    return json.dumps([flow_obj["metadata"].get("uid"), triggers], sort_keys=True)


def _has_kubernetes_triggers(flow_obj: Mapping[str, Any]) -> bool:
    triggers = (flow_obj.get("spec") or {}).get("triggers") or []
    return any(isinstance(t, dict) and t.get("kubernetes") for t in triggers)


class FlowTriggers:
    """The operator's trigger machinery: the shared watches and the CronJob settings."""

    def __init__(self, manager: kubernetes.WatchManager, settings: schedule.Settings) -> None:
        self.manager = manager
        self.settings = settings
        #: (namespace, name) -> the Ready Flow object, for Flows with kubernetes triggers.
        self._watched: dict[tuple[str, str], Mapping[str, Any]] = {}
        # sync() awaits while it stops watches: one at a time, each with the latest index.
        self._lock = asyncio.Lock()

    async def sync(self, api: kube.Client, flow_obj: Mapping[str, Any]) -> Outcome:
        """Make a Ready Flow's watches and CronJobs match its triggers."""
        meta = flow_obj["metadata"]
        await self._watch(meta["namespace"], meta["name"], flow_obj)
        try:
            cronjobs = await schedule.sync_cronjobs(api, flow_obj, self.settings)
        except common.TriggerError as exc:
            return Outcome("False", "InvalidTrigger", str(exc))
        except kube.ApiError as exc:
            message = f"syncing CronJobs: {exc}"
            return Outcome("False", "ApiError", message, exc if exc.retryable else None)
        return Outcome("True", "Synced", _summary(flow_obj, cronjobs))

    async def suspend(self, namespace: str, name: str, *, has_triggers: bool) -> Outcome:
        """A Flow that is not Ready: stop its watches; its CronJobs stay until it is fixed."""
        await self._watch(namespace, name, None)
        if not has_triggers:
            return Outcome("True", "NoTriggers")
        return Outcome("False", "FlowNotReady", "triggers are not synced while Ready is False")

    async def forget(self, namespace: str, name: str) -> None:
        """A Flow that is gone: stop its watches (its CronJobs go with it, by ownerReference)."""
        await self._watch(namespace, name, None)

    async def close(self) -> None:
        """Stop every watch (operator shutdown)."""
        async with self._lock:
            self._watched.clear()
            await self.manager.close()

    async def _watch(self, namespace: str, name: str, flow_obj: Mapping[str, Any] | None) -> None:
        key = (namespace, name)
        wanted = flow_obj if flow_obj is not None and _has_kubernetes_triggers(flow_obj) else None
        async with self._lock:
            if _watch_fingerprint(self._watched.get(key)) == _watch_fingerprint(wanted):
                return
            if wanted is None:
                self._watched.pop(key, None)
            else:
                self._watched[key] = wanted
            await self.manager.sync(list(self._watched.values()))


def run_lineage(cache_: cache.Cache) -> kubernetes.Lineage:
    """What the watch manager asks to tell a run's own objects (its FlowRun, its pods)."""

    def lineage(namespace: str, kind: str, name: str) -> tuple[str, int] | None:
        if kind == "Pod":
            pod = cache_.pod(namespace, name)
            # a pod the cache no longer holds is named <run>-<attempt>
            name = pod.run if pod is not None else name.rpartition("-")[0]
        elif kind != "FlowRun":
            return None
        run = cache_.run_of(namespace, name)
        if run is None:
            return None
        annotations = run.obj["metadata"].get("annotations") or {}
        depth = str(annotations.get(wellknown.DEPTH_ANNOTATION, "0"))
        return run.model.spec.flow, int(depth) if depth.isdigit() else 0

    return lineage


def _summary(flow_obj: Mapping[str, Any], cronjobs: list[str]) -> str:
    parts = []
    if cronjobs:
        parts.append("CronJobs: " + ", ".join(cronjobs))
    own = str(flow_obj["metadata"]["namespace"])
    watched = sorted(
        f"{t.kubernetes.api_version}/{t.kubernetes.kind} in "
        + (t.kubernetes.watched_namespace(own) or "every namespace")
        for t in common.triggers_of(flow_obj)
        if t.kubernetes is not None
    )
    if watched:
        parts.append("watching: " + ", ".join(dict.fromkeys(watched)))
    return "; ".join(parts)
