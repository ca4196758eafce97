"""The operator's shared state: the API client, settings, metrics, cache and work queue.

One :class:`Controller` is built by :mod:`agentflows.controller.main` and passed to every
reconcile. What is kept here is a cache or a scheduling aid; nothing here is needed to recover
after a restart (``NOTES.md``): the cache is listed again and every object reconciled.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.controller import cache, flowtriggers, settings, snapshots, tooldiscovery
from agentflows.controller import metrics as metrics_mod
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube


@dataclasses.dataclass
class Controller:
    """Everything a reconcile needs besides the object itself."""

    api: kube.Client
    config: settings.OperatorConfig
    metrics: metrics_mod.Metrics
    queue: workqueue.WorkQueue = dataclasses.field(init=False)
    #: Agents, Flows, FlowRuns and runner pods, kept by watches.
    cache: cache.Cache = dataclasses.field(init=False)
    #: Snapshots built per version of what a Flow reaches, and per run.
    snapshots: snapshots.Snapshots = dataclasses.field(init=False)
    #: The Flows' CronJobs and kubernetes watches (one WatchManager for the operator's life).
    triggers: flowtriggers.FlowTriggers = dataclasses.field(init=False)
    #: Background MCP tool discovery for Agent status.
    tools: tooldiscovery.ToolDiscovery = dataclasses.field(init=False)
    #: One admission at a time per (namespace, flow), so concurrency policies see each other.
    _flow_locks: dict[tuple[str, str], asyncio.Lock] = dataclasses.field(default_factory=dict)
    #: When an attempt was first seen lost (monotonic seconds), for its backoff.
    lost_at: dict[tuple[str, str, int], float] = dataclasses.field(default_factory=dict)
    #: When an attempt's pod was first seen ended with no result on the run yet.
    ended_at: dict[tuple[str, str, int], float] = dataclasses.field(default_factory=dict)
    #: Attempts whose pod this operator created or saw while ``status.podCreated`` did not
    #: record it yet (a Pending pod): gone, such a pod was lost, never to be created again.
    pods_seen: set[tuple[str, str, int]] = dataclasses.field(default_factory=set)
    #: What a Flow's or Agent's last validation was computed from, and what it found.
    validated: dict[tuple[str, str, str], Any] = dataclasses.field(default_factory=dict)
    #: (namespace, memory) -> the bounds retention applies at its next reconcile.
    retention: dict[tuple[str, str], agent_api.AgentMemory] = dataclasses.field(
        default_factory=dict
    )

    def flow_lock(self, namespace: str, flow: str) -> asyncio.Lock:
        """The admission lock of a Flow."""
        return self._flow_locks.setdefault((namespace, flow), asyncio.Lock())

    def enqueue(self, kind: str, namespace: str, name: str, delay: float = 0.0) -> None:
        """Ask for a reconcile of an object (of this operator's namespaces and shard only)."""
        if self.config.owns(namespace):
            self.queue.add(workqueue.Key(kind, namespace, name), delay)

    def forget_run(self, namespace: str, name: str) -> None:
        """Drop what is kept about a deleted run."""
        for table in (self.lost_at, self.ended_at):
            for key in [k for k in table if k[:2] == (namespace, name)]:
                del table[key]
        self.pods_seen.difference_update([k for k in self.pods_seen if k[:2] == (namespace, name)])
        self.snapshots.forget(namespace, name)
        self.metrics.forget_run(namespace, name)


def status_patch(status: dict[str, Any]) -> dict[str, Any]:
    """The body of a merge patch on a status subresource."""
    return {"status": status}
