"""Names, labels and owner references of what the operator creates (``kube/NOTES.md``)."""

from __future__ import annotations

from typing import Any

from agentflows.kube import status_store

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "agentflows"
FLOW = "agentflows.io/flow"
RUN = "agentflows.io/run"
ATTEMPT = "agentflows.io/attempt"
#: Annotation on a FlowRun: the highest attempt whose pod the operator has created. A pod of an
#: attempt at or below it that is gone was lost; it is never created a second time.
POD_CREATED = "agentflows.io/pod-created"


def of_run(run_name: str, flow_name: str) -> dict[str, str]:
    """Labels on everything created for a run (long names shortened as label values must be)."""
    return {
        MANAGED_BY: MANAGER,
        FLOW: status_store.label_value(flow_name),
        RUN: status_store.label_value(run_name),
    }


def pod_name(run_name: str, attempt: int) -> str:
    """The runner pod of an attempt: ``<run>-<attempt>``."""
    return f"{run_name}-{attempt}"


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    """A controller owner reference to ``obj`` (garbage-collected with it)."""
    return {
        "apiVersion": obj.get("apiVersion", "agentflows.io/v1alpha1"),
        "kind": obj.get("kind", "FlowRun"),
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
