"""The restricted pod security every pod agentflows creates runs with (runner and trigger pods).

One definition, so the Pod Security Standards "restricted" profile cannot drift between the
pods of different components. The image runs as uid 65532 with a read-only root filesystem;
pods mount an emptyDir at /tmp for scratch space.
"""

from __future__ import annotations

from typing import Any

#: The image's non-root user (and group).
UID = 65532


def container_security_context() -> dict[str, Any]:
    """A container's security context (restricted)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": True,
    }


def pod_security_context(*, fs_group: bool = False) -> dict[str, Any]:
    """A pod's security context (restricted); ``fs_group`` when volumes must be group-owned."""
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if fs_group:
        context["fsGroup"] = UID
    return context
