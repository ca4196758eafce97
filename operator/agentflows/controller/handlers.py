"""kopf handlers: every watch event only enqueues the key of the object to reconcile.

Registered in kopf's default registry when this module is imported (by :mod:`main`). kopf is the
watcher here; the decisions are in the reconcilers, which the work queue runs. Event handlers
never write anything, so kopf needs no finalizers and keeps no state on our objects. The first
events after a start are the initial listing, so a restarted operator picks up every object.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from agentflows.controller import context, labels, workqueue
from agentflows.kube import kubeconfig

GROUP = "agentflows.io"
VERSION = "v1alpha1"


def _controller(memo: Any) -> context.Controller:
    controller = memo.controller
    assert isinstance(controller, context.Controller)
    return controller


@kopf.on.login()
async def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """Log in with the same credentials as our API client (kubeconfig context or in-cluster)."""
    config: kubeconfig.Config = _controller(memo).api.config
    if config.stale():
        await asyncio.to_thread(config.renew)
    authorization = config.authorization() or ""
    scheme, _sep, token = authorization.partition(" ")
    return kopf.ConnectionInfo(
        server=config.server,
        ca_path=config.ca_file,
        ca_data=config.ca_data,
        insecure=config.insecure,
        scheme=scheme or None,
        token=token or None,
        certificate_path=config.cert_file,
        certificate_data=config.cert_data,
        private_key_path=config.key_file,
        private_key_data=config.key_data,
        default_namespace=config.namespace,
        expiration=config.expiration,
    )


@kopf.on.event(GROUP, VERSION, "flowruns")
def flowrun_event(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """A FlowRun changed (spec.cancel, a decision, the runner's progress) or was deleted."""
    _controller(memo).enqueue(workqueue.FLOWRUN, namespace or "", name)


@kopf.on.event(
    "", "v1", "pods", labels={labels.MANAGED_BY: labels.MANAGER, labels.RUN: kopf.PRESENT}
)
def pod_event(meta: Any, namespace: str | None, memo: Any, **_: Any) -> None:
    """A runner pod changed: its run (the owner; labels may be shortened) may change phase."""
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "FlowRun":
            _controller(memo).enqueue(workqueue.FLOWRUN, namespace or "", owner["name"])


@kopf.on.event(GROUP, VERSION, "agents")
def agent_event(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """An Agent changed or was deleted."""
    _controller(memo).enqueue(workqueue.AGENT, namespace or "", name)


@kopf.on.event(GROUP, VERSION, "flows")
def flow_event(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """A Flow changed or was deleted."""
    _controller(memo).enqueue(workqueue.FLOW, namespace or "", name)
