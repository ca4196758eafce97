"""Operator settings: what ``agentflows operator`` was started with, and kopf's settings.

Called by :mod:`agentflows.controller.main` once at start. kopf keeps its progress and diff-base
in annotations under ``agentflows.io`` (never in ``status``, which belongs to the writers listed in
``kube/NOTES.md``), runs standalone (one operator; no peering objects), and posts Kubernetes
Events only for warnings from its own machinery; phase-change Events are posted by the reconcilers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

import kopf

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
    workers: int = 8
    #: Active runs are looked at again at least this often, events or not.
    resync_seconds: float = 30.0
    #: Agents that are not Ready (a Secret may appear; Secrets are not watched) are re-checked.
    not_ready_recheck_seconds: float = 30.0

    @property
    def clusterwide(self) -> bool:
        """True when no namespace was named."""
        return not self.namespaces


def namespaces_from_env(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The namespaces named by ``AGENTFLOWS_NAMESPACES`` (comma-separated)."""
    raw = (env if env is not None else os.environ).get(NAMESPACES_ENV, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def runner_image_from_env(env: Mapping[str, str] | None = None) -> str:
    """The runner image from ``AGENTFLOWS_RUNNER_IMAGE``, else the default."""
    return (env if env is not None else os.environ).get(RUNNER_IMAGE_ENV) or DEFAULT_RUNNER_IMAGE


def kopf_settings() -> kopf.OperatorSettings:
    """The kopf settings of this operator."""
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="agentflows.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="agentflows.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "agentflows.io/finalizer"
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    # Watches are re-opened every few minutes so a silently dropped connection cannot stall us.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    return settings
