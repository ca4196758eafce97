"""AgentSession retention on the cluster: the operator deletes what a memory no longer keeps.

The runner's identity may read (a dry-run patch), create and update AgentSessions by name,
never list or delete them (``config/rbac/runner/role.yaml``): a list would show every
memory's sessions of the namespace, a delete would remove them. So retention, which needs
both, is the operator's. When a run ends (:func:`agentflows.controller.finishing.finish`),
:func:`note` records, for every memory the run's turns may write (its snapshot's
:meth:`~agentflows.controller.snapshots.Snapshots.memories`), the strictest bounds seen, and
enqueues the memory (key kind :data:`workqueue.SESSIONS`, the key's name is the memory).
:func:`reconcile` lists that memory's sessions (metadata only) and deletes those past
``maxAgeSeconds`` or beyond ``maxSessions`` (:func:`sessions.enforce_retention`, the rule the
local store applies after each write). Many runs ending on one memory cost one list: a key
waiting in the queue is not added twice. The bounds are kept in memory only; a restart loses
those not yet applied, and the memory's next run ending applies them again.
"""

from __future__ import annotations

import logging

from agentflows.agents import sessions
from agentflows.api import snapshot as snapshot_api
from agentflows.controller import context
from agentflows.controller.runtime import workqueue
from agentflows.kube import session_store

log = logging.getLogger(__name__)


def note(ctl: context.Controller, namespace: str, snapshot: snapshot_api.Snapshot) -> None:
    """Ask for retention of every memory the run of ``snapshot`` may have written."""
    for memory, limits in ctl.snapshots.memories(snapshot).items():
        key = (namespace, memory)
        ctl.retention[key] = sessions.strictest(ctl.retention.get(key), limits)
        ctl.enqueue(workqueue.SESSIONS, namespace, memory)


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Delete the memory's sessions its bounds no longer keep."""
    limits = ctl.retention.pop((key.namespace, key.name), None)
    if limits is None:
        return None
    store = session_store.SessionStore(ctl.api, key.namespace)
    try:
        retired = await sessions.enforce_retention(store, key.name, limits)
    except BaseException:
        # retried by the queue: keep the bounds (merged with any noted meanwhile)
        ctl.retention[(key.namespace, key.name)] = sessions.strictest(
            ctl.retention.get((key.namespace, key.name)), limits
        )
        raise
    if retired:
        log.info(
            "memory %s/%s: %d session(s) retired (maxSessions=%d, maxAgeSeconds=%d)",
            key.namespace,
            key.name,
            len(retired),
            limits.max_sessions,
            limits.max_age_seconds,
        )
    ctl.metrics.sessions_retired.labels(key.namespace).inc(len(retired))
    return None
