"""Sessions on the cluster: one ``AgentSession`` object per session, the runner's session store.

The runner passes a :class:`SessionStore` to :class:`agentflows.agents.host.LiveCapabilities`;
``agentflows sessions -n NS`` uses it too. It implements :class:`agentflows.agents.sessions.Store`
(the rules of what is stored are there). Why a resource of our own, not a ConfigMap: the
runner's admission policy confines a runner to the ConfigMaps of its own run, and a session
outlives runs; a kind of its own gets exactly the RBAC verbs it needs, a typed schema,
``kubectl get agentsessions`` with its memory, session and turns as columns, and no ConfigMap
of the namespace can be mistaken for one.

- Name :func:`agentflows.kube.objects.session_name`; labels ``agentflows.io/memory`` and
  ``agentflows.io/session`` (label-safe), annotations with the exact memory and session, the
  last write and the size, so a listing reads metadata only (``PartialObjectMetadataList``).
- Owned by the Agent that first wrote it (not blocking its deletion: a runner may not set
  finalizers), so deleting the Agent deletes its sessions. When the Agent cannot be read, the
  session is written without an owner rather than not at all.
- The runner's store is ``confined``: it reads with a dry-run empty merge patch, which
  admission sees (a GET it never sees), so the runner policy confines its reads to the memories
  its run's Agents name, as it confines its writes.
- An update reads the object, applies the change and replaces it with the resourceVersion it
  read; a conflict (another writer was first, or created it first) reads again and re-applies,
  up to :data:`CONFLICT_RETRIES` tries with a short random backoff (:data:`CONFLICT_BACKOFF`).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from agentflows import api as api_group
from agentflows.api import retry, wellknown
from agentflows.kube import client as kube_client
from agentflows.kube import objects

if TYPE_CHECKING:  # imported when a session is read or written: every runner builds a store
    # before its first node, and most runs have no agent with a session
    from agentflows.agents import sessions
    from agentflows.api import agent as agent_api
    from agentflows.api import agentsession as agentsession_api

#: Times an update that lost a race is tried (fifty parallel writers need about fifty).
CONFLICT_RETRIES = 200
#: The random pause before a retried update: up to 10 ms, doubling to up to 0.5 s.
CONFLICT_BACKOFF = retry.Backoff(initial=0.01, cap=0.5, jitter=1.0, attempts=CONFLICT_RETRIES)
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class SessionStore:
    """AgentSessions in one namespace (see module docstring)."""

    def __init__(
        self, client: kube_client.Client, namespace: str, *, confined: bool = False
    ) -> None:
        """``confined``: read as the runner does (below); people and the operator GET."""
        self.client = client
        self.namespace = namespace
        self.confined = confined
        self._owners: dict[str, dict[str, Any] | None] = {}

    def _path(self, name: str | None = None) -> str:
        return kube_client.path_of("agentsessions", self.namespace, name)

    async def read(self, memory: str, session: str) -> agentsession_api.AgentSessionSpec | None:
        """The stored session, or None."""
        found = await self._get(objects.session_name(memory, session))
        return None if found is None else _spec_of(found, memory, session)

    async def update(self, memory: str, session: str, agent: str, change: sessions.Change) -> None:
        """Apply ``change`` with a resourceVersion-checked replace, retried on conflicts."""
        name = objects.session_name(memory, session)
        tries = CONFLICT_BACKOFF.tries()
        while True:
            current = await self._get(name)
            spec = change(None if current is None else _spec_of(current, memory, session))
            body = await self._body(name, spec, current)
            try:
                if current is None:
                    await self.client.create(self._path(), body)
                else:
                    await self.client.request("PUT", self._path(name), body)
                return
            except kube_client.ApiError as exc:
                if not (exc.conflict or exc.not_found):
                    raise _store_error(exc) from None
            delay = tries.failed()
            if delay is None:
                break
            await asyncio.sleep(delay)
        from agentflows.agents import sessions

        raise sessions.StoreError(
            f"AgentSession {self.namespace}/{name}: still conflicting after {CONFLICT_RETRIES} "
            "tries",
            retryable=True,
        )

    async def list(self, memory: str | None = None) -> list[sessions.SessionInfo]:
        """The stored sessions (of ``memory`` only when given), oldest write first."""
        params: dict[str, Any] = {}
        if memory is not None:
            params["labelSelector"] = f"{wellknown.MEMORY}={objects.label_value(memory)}"
        try:
            found = await self.client.request(
                "GET", self._path(), params=params or None, accept=_METADATA_LIST
            )
        except kube_client.ApiError as exc:
            raise _store_error(exc) from None
        infos = [_info(item["metadata"]) for item in found.get("items") or []]
        return sorted(
            (i for i in infos if memory is None or i.memory == memory),
            key=lambda info: info.updated_at,
        )

    async def delete(self, memory: str, session: str) -> bool:
        """Delete one session; False when there was none."""
        try:
            await self.client.delete(
                self._path(objects.session_name(memory, session)), missing_ok=False
            )
        except kube_client.ApiError as exc:
            if exc.not_found:
                return False
            raise _store_error(exc) from None
        return True

    async def retain(self, memory: str, limits: agent_api.AgentMemory) -> sessions.Retired:
        """None: on the cluster the operator enforces retention when a run ends.

        The runner's identity may patch (a confined read), create and update AgentSessions,
        not get, list or delete them (``config/rbac/runner/role.yaml``);
        :mod:`agentflows.controller.retention` calls
        :func:`agentflows.agents.sessions.enforce_retention` on this store as the operator.
        """
        return None

    async def _get(self, name: str) -> dict[str, Any] | None:
        """The object, or None. Confined, a read is a dry-run empty merge patch.

        Admission never sees a GET, so a runner allowed to get AgentSessions could read every
        memory's by name. A dry-run patch changes nothing and returns the object as stored, and
        admission sees it as an update of that object: the runner policy lets it through only
        for a memory the run's Agents name, as it does a write. The runner's Role has patch and
        no get (``config/rbac/runner/role.yaml``).
        """
        try:
            found: dict[str, Any] = (
                await self.client.request(
                    "PATCH",
                    self._path(name),
                    {},
                    params={"dryRun": "All"},
                    content_type=kube_client.MERGE_PATCH,
                )
                if self.confined
                else await self.client.get(self._path(name))
            )
        except kube_client.ApiError as exc:
            if exc.not_found:
                return None
            raise _store_error(exc) from None
        return found

    async def _body(
        self, name: str, spec: agentsession_api.AgentSessionSpec, current: dict[str, Any] | None
    ) -> dict[str, Any]:
        wire = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": objects.session_labels(spec.memory, spec.session),
            "annotations": {
                wellknown.MEMORY: spec.memory,
                wellknown.SESSION: spec.session,
                wellknown.UPDATED_ANNOTATION: spec.updated_at,
                wellknown.TURNS_ANNOTATION: str(spec.turns),
                wellknown.BYTES_ANNOTATION: str(len(json.dumps(wire).encode())),
            },
        }
        if current is not None:
            old = current["metadata"]
            metadata["resourceVersion"] = old["resourceVersion"]
            if old.get("ownerReferences"):
                metadata["ownerReferences"] = old["ownerReferences"]
        else:
            owner = await self._owner(spec.agent)
            if owner is not None:
                metadata["ownerReferences"] = [
                    objects.owner_reference(owner, controller=False, block=False)
                ]
        return {
            "apiVersion": api_group.API_VERSION,
            "kind": "AgentSession",
            "metadata": metadata,
            "spec": wire,
        }

    async def _owner(self, agent: str) -> dict[str, Any] | None:
        """The Agent (read once per store), or None when it cannot be read."""
        if agent not in self._owners:
            try:
                self._owners[agent] = await self.client.get(
                    kube_client.path_of("agents", self.namespace, agent)
                )
            except kube_client.ApiError:
                self._owners[agent] = None
        return self._owners[agent]


def _spec_of(found: dict[str, Any], memory: str, session: str) -> agentsession_api.AgentSessionSpec:
    """The stored spec, when it is the session asked for.

    Another run's Agents may create an AgentSession under any name (the policy checks only
    that its ``spec.memory`` is theirs), so one planted under this session's name is refused,
    never loaded into this memory's conversation.
    """
    from agentflows.agents import sessions
    from agentflows.api import agentsession as agentsession_api

    spec = agentsession_api.AgentSessionSpec.model_validate(found.get("spec") or {})
    if (spec.memory, spec.session) != (memory, session):
        name = found.get("metadata", {}).get("name")
        raise sessions.StoreError(
            f"AgentSession {name} holds session {spec.session!r} of memory {spec.memory!r}, not "
            f"{session!r} of {memory!r}: this memory's Agents did not write it; delete it "
            f"(kubectl delete agentsession {name})"
        )
    return spec


def _info(metadata: dict[str, Any]) -> sessions.SessionInfo:
    from agentflows.agents import sessions

    annotations = metadata.get("annotations") or {}
    return sessions.SessionInfo(
        memory=annotations.get(wellknown.MEMORY, ""),
        session=annotations.get(wellknown.SESSION, ""),
        turns=int(annotations.get(wellknown.TURNS_ANNOTATION, "0")),
        updated_at=annotations.get(wellknown.UPDATED_ANNOTATION, ""),
        size=int(annotations.get(wellknown.BYTES_ANNOTATION, "0")),
        where=metadata.get("name", ""),
    )


def _store_error(exc: kube_client.ApiError) -> sessions.StoreError:
    from agentflows.agents import sessions

    return sessions.StoreError(str(exc), retryable=exc.retryable)
