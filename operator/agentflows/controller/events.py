"""Kubernetes Events (core/v1) about our objects: one per phase change and notable step.

Best effort: an Event that cannot be posted is logged and forgotten, never retried, and never
fails a reconcile. Messages are written by the reconcilers and never carry secret values (the
operator never reads any). Reasons are CamelCase.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from agentflows import api as api_group
from agentflows.api import times
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
COMPONENT = "agentflows-operator"
_INSTANCE = socket.gethostname()


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``involvedObject`` reference of an object."""
    meta = obj.get("metadata", {})
    return {
        "apiVersion": obj.get("apiVersion", ""),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "uid": meta.get("uid", ""),
    }


async def post(
    api: kube.Client, obj: dict[str, Any], type_: str, reason: str, message: str
) -> None:
    """Post one Event about ``obj``."""
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace", "default")
    stamp = times.api_time()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
        "involvedObject": involved(obj),
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": f"{api_group.GROUP}/{COMPONENT}",
        "reportingInstance": _INSTANCE,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        await api.create(kube.path_of("events", namespace), body)
    except kube.ApiError as exc:
        log.warning("event %s on %s/%s not posted: %s", reason, namespace, meta.get("name"), exc)
