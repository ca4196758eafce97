"""Operator settings: what ``agentflows operator`` was started with.

Called by :mod:`agentflows.controller.main` once at start, and read by every reconcile.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Mapping

#: Comma-separated namespaces to watch; empty or unset: every namespace.
NAMESPACES_ENV = "AGENTFLOWS_NAMESPACES"
#: The runner image when a Flow does not name one.
RUNNER_IMAGE_ENV = "AGENTFLOWS_RUNNER_IMAGE"
DEFAULT_RUNNER_IMAGE = "agentflows:0.1.0"
#: The runner pods' service account when a Flow does not name one.
DEFAULT_RUNNER_SERVICE_ACCOUNT = "agentflows-runner"


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """Everything the reconcilers need to know about how the operator was started."""

    namespaces: tuple[str, ...] = ()
    runner_image: str = DEFAULT_RUNNER_IMAGE
    runner_service_account: str = DEFAULT_RUNNER_SERVICE_ACCOUNT
    metrics_port: int | None = 8080
    workers: int = 32
    #: Active runs are looked at again at least this often, events or not.
    resync_seconds: float = 30.0
    #: Agents that are not Ready (a Secret may appear; Secrets are not watched) are re-checked.
    not_ready_recheck_seconds: float = 30.0

    #: This operator's shard of the namespaces, and how many shards there are.
    shard_index: int = 0
    shard_count: int = 1

    @property
    def clusterwide(self) -> bool:
        """True when no namespace was named."""
        return not self.namespaces

    def owns(self, namespace: str) -> bool:
        """Whether this operator handles ``namespace`` (named, and of its shard)."""
        if self.namespaces and namespace not in self.namespaces:
            return False
        return shard_of(namespace, self.shard_count) == self.shard_index


def shard_of(namespace: str, shard_count: int) -> int:
    """The shard a namespace belongs to: a stable hash of its name (the same in every process)."""
    return zlib.crc32(namespace.encode()) % shard_count if shard_count > 1 else 0


def namespaces_from_env(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The namespaces named by ``AGENTFLOWS_NAMESPACES`` (comma-separated)."""
    raw = (env if env is not None else os.environ).get(NAMESPACES_ENV, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def runner_image_from_env(env: Mapping[str, str] | None = None) -> str:
    """The runner image from ``AGENTFLOWS_RUNNER_IMAGE``, else the default."""
    return (env if env is not None else os.environ).get(RUNNER_IMAGE_ENV) or DEFAULT_RUNNER_IMAGE
