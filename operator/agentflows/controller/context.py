"""The operator's shared state: the API client, settings, metrics and the work queue.

One :class:`Controller` is built by :mod:`agentflows.controller.main` and handed to kopf as the
``memo`` (kopf copies the memo shallowly per object, so every handler sees these same objects).
What is kept here is a cache or a scheduling aid; nothing here is needed to recover after a
restart (``NOTES.md``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from agentflows.controller import flowtriggers, settings, tooldiscovery, workqueue
from agentflows.controller import metrics as metrics_mod
from agentflows.kube import client as kube


@dataclasses.dataclass
class Controller:
    """Everything a reconcile needs besides the object itself."""

    api: kube.Client
    config: settings.OperatorConfig
    metrics: metrics_mod.Metrics
    queue: workqueue.WorkQueue = dataclasses.field(init=False)
    #: The Flows' CronJobs and kubernetes watches (one WatchManager for the operator's life).
    triggers: flowtriggers.FlowTriggers = dataclasses.field(init=False)
    #: Background MCP tool discovery for Agent status.
    tools: tooldiscovery.ToolDiscovery = dataclasses.field(init=False)
    #: One admission at a time per (namespace, flow), so concurrency policies see each other.
    _flow_locks: dict[tuple[str, str], asyncio.Lock] = dataclasses.field(default_factory=dict)
    #: When an attempt was first seen lost (monotonic seconds), for its backoff.
    lost_at: dict[tuple[str, str, int], float] = dataclasses.field(default_factory=dict)

    def flow_lock(self, namespace: str, flow: str) -> asyncio.Lock:
        """The admission lock of a Flow."""
        return self._flow_locks.setdefault((namespace, flow), asyncio.Lock())

    def enqueue(self, kind: str, namespace: str, name: str, delay: float = 0.0) -> None:
        """Ask for a reconcile of an object (of a namespace this operator owns; others: no-op)."""
        if not self.config.owns(namespace):
            return
        self.queue.add(workqueue.Key(kind, namespace, name), delay)

    def forget_run(self, namespace: str, name: str) -> None:
        """Drop what is kept about a deleted run."""
        for key in [k for k in self.lost_at if k[:2] == (namespace, name)]:
            del self.lost_at[key]
        self.metrics.forget_run(namespace, name)


def status_patch(status: dict[str, Any]) -> dict[str, Any]:
    """The body of a merge patch on a status subresource."""
    return {"status": status}
