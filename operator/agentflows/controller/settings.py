"""Operator settings: what ``agentflows operator`` was started with.

Called by :mod:`agentflows.controller.main` once at start. :meth:`OperatorConfig.owns` is the
one rule of which namespaces this operator reconciles (its ``--namespace`` list and its shard);
:func:`leader_election` checks the flags that name the Lease of
:mod:`agentflows.controller.runtime.leader`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import zlib
from collections.abc import Mapping

from agentflows.api import common, errors
from agentflows.controller.runtime import leader
from agentflows.kube import kubeconfig

#: Comma-separated namespaces to watch; empty or unset: every namespace.
NAMESPACES_ENV = "AGENTFLOWS_NAMESPACES"
#: The runner image when a Flow does not name one.
RUNNER_IMAGE_ENV = "AGENTFLOWS_RUNNER_IMAGE"
DEFAULT_RUNNER_IMAGE = "agentflows:0.1.0"
#: The runner pods' service account when a Flow does not name one.
DEFAULT_RUNNER_SERVICE_ACCOUNT = "agentflows-runner"
#: The pod's name (the downward API's ``metadata.name``): the operator's identity on its Lease.
POD_NAME_ENV = "POD_NAME"
#: Where the Lease lives when neither a flag nor the pod's service account says.
DEFAULT_LEASE_NAMESPACE = "agentflows-system"
DEFAULT_LEASE_NAME = "agentflows-operator"


class SettingsError(errors.AgentflowsError):
    """A flag of ``agentflows operator`` is invalid; the message names it and what is valid."""


def leader_election(namespace: str, lease_name: str, identity: str) -> leader.LeaderElection:
    """The Lease named by ``--leader-election-namespace`` and ``--lease-name``, checked.

    Raises :class:`SettingsError` naming the flag when either is not a valid name.
    """
    for flag, value in (
        ("--leader-election-namespace", namespace),
        ("--lease-name", lease_name),
    ):
        problem = common.name_problem(value)
        if problem:
            raise SettingsError(f"{flag}: {problem}")
    return leader.LeaderElection(namespace=namespace, lease_name=lease_name, identity=identity)


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
    #: None: this process works alone (``--leader-elect=false``).
    leader_election: leader.LeaderElection | None = None
    #: This operator reconciles the namespaces whose shard is ``shard_index`` of ``shard_count``.
    shard_index: int = 0
    shard_count: int = 1

    def __post_init__(self) -> None:
        if self.shard_count < 1:
            raise SettingsError(f"--shard-count {self.shard_count}: must be 1 or more")
        if not 0 <= self.shard_index < self.shard_count:
            raise SettingsError(
                f"--shard-index {self.shard_index}: with --shard-count {self.shard_count} it "
                f"must be from 0 to {self.shard_count - 1}"
            )

    @property
    def clusterwide(self) -> bool:
        """True when no namespace was named."""
        return not self.namespaces

    def owns(self, namespace: str) -> bool:
        """Whether this operator reconciles the objects of ``namespace``.

        A namespace named by ``--namespace`` (or any, when none is) that falls in this shard.
        """
        if self.namespaces and namespace not in self.namespaces:
            return False
        return shard_of(namespace, self.shard_count) == self.shard_index


def shard_of(namespace: str, shard_count: int) -> int:
    """The shard of a namespace: CRC-32 (IEEE) of its name, modulo the number of shards.

    Stable across processes, machines and versions (never Python's salted ``hash()``), and the
    same as ``python3 -c "import zlib; print(zlib.crc32(b'NAMESPACE') % N)"``.
    """
    return zlib.crc32(namespace.encode()) % shard_count


def lease_name(base: str, shard_index: int, shard_count: int) -> str:
    """The Lease of one shard's replicas: ``base``, plus ``-shard-<i>`` when sharded."""
    return f"{base}-shard-{shard_index}" if shard_count > 1 else base


def own_namespace() -> str:
    """The namespace of the operator's pod (its service-account mount), else the default one."""
    found = kubeconfig.SERVICE_ACCOUNT_DIR / "namespace"
    if found.is_file():
        return found.read_text().strip() or DEFAULT_LEASE_NAMESPACE
    return DEFAULT_LEASE_NAMESPACE


def identity_from_env(env: Mapping[str, str] | None = None) -> str:
    """The replica's name on the Lease: ``$POD_NAME``, else the host name and process id."""
    pod = (env if env is not None else os.environ).get(POD_NAME_ENV, "").strip()
    return pod or f"{socket.gethostname()}_{os.getpid()}"


def namespaces_from_env(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The namespaces named by ``AGENTFLOWS_NAMESPACES`` (comma-separated)."""
    raw = (env if env is not None else os.environ).get(NAMESPACES_ENV, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def runner_image_from_env(env: Mapping[str, str] | None = None) -> str:
    """The runner image from ``AGENTFLOWS_RUNNER_IMAGE``, else the default."""
    return (env if env is not None else os.environ).get(RUNNER_IMAGE_ENV) or DEFAULT_RUNNER_IMAGE
