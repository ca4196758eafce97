"""A run's snapshot: the Flow, Agents and sub-flows as they were when the run started.

The operator calls :func:`build_snapshot` (fed from the API through a plain lookup) and
:func:`write_snapshot` before it creates the first runner pod; the runner calls
:func:`read_snapshot`. The ConfigMap ``<run>-snapshot`` is owned by the FlowRun and holds
``data["snapshot.json"] = {"flow": NAME, "flows": {NAME: spec}, "agents": {NAME: spec}}``
(wire JSON of the specs), the same shape as the local ``<run>.snapshot.json`` of
:mod:`agentflows.cli.local`. Edits to a Flow or an Agent never change a started run.

Only a snapshot the operator wrote for the run counts: owned by the FlowRun's uid and, once
the operator stored it in ``status.snapshotDigest``, with that content digest
(:func:`digest_of`). Whoever else could write a ConfigMap of that name (a namespace editor; a
runner is refused by ``config/policies/runner_own_run.yaml``) cannot make a run start from
what they wrote: at admission the operator replaces any other ConfigMap of that name with its
own (:func:`write_snapshot`), and later the operator and the runner refuse one that does not
match (:meth:`RunSnapshot.check`).

A reference that cannot be resolved is left out rather than refused: compiling the Flow in
the runner then fails the run with reason FlowInvalid and a message naming the missing
Agent or Flow, which is where a user looks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from agentflows.api import calls
from agentflows.engine import graph
from agentflows.kube import client as kube_client
from agentflows.kube import mounted, objects

#: The ConfigMap key holding the snapshot JSON.
SNAPSHOT_KEY = "snapshot.json"


class SnapshotError(Exception):
    """The snapshot cannot be built or read (permanent: the run cannot start from it)."""


def snapshot_name(run: str) -> str:
    """Name of the snapshot ConfigMap of run ``run``."""
    return objects.snapshot_name(run)


def digest_of(text: str) -> str:
    """The content digest of a snapshot's JSON text: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def lookup_in(
    flows: Mapping[str, Mapping[str, Any]], agents: Mapping[str, Mapping[str, Any]]
) -> graph.StaticResolver:
    """A lookup over dictionaries of Flow and Agent specs (wire JSON) by name."""
    return graph.StaticResolver.from_wire(agents, flows)


def build_snapshot(flow_name: str, lookup: calls.Lookup) -> dict[str, Any]:
    """Collect Flow ``flow_name`` and every Agent and sub-flow it reaches (:func:`calls.reach`).

    Every call counts, a tool node's Agent too (the runner needs its tool's definition); what
    is not found is left out. Raises :class:`SnapshotError` when the Flow itself does not exist.
    """
    reached = calls.reach(flow_name, lookup)
    if flow_name not in reached.flows:
        raise SnapshotError(f'no Flow "{flow_name}"')
    return {
        "flow": flow_name,
        "flows": {name: spec.to_wire() for name, spec in reached.flows.items()},
        "agents": {name: spec.to_wire() for name, spec in reached.agents.items()},
    }


async def write_snapshot(
    client: kube_client.Client, flowrun: Mapping[str, Any], snapshot: Mapping[str, Any]
) -> dict[str, Any]:
    """Create ``<run>-snapshot`` owned by the FlowRun and return it as stored.

    Called at admission, before any runner of the run exists, so what the operator built is the
    run's snapshot: a ConfigMap of that name already holding exactly it and owned by the run is
    kept (an admission cut short and retried), any other one is deleted and written again.
    """
    meta = flowrun["metadata"]
    run = meta["name"]
    text = json.dumps(snapshot, ensure_ascii=False, sort_keys=True)
    name = snapshot_name(run)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": objects.run_labels(run, str(snapshot["flow"])),
            "ownerReferences": [
                objects.owner_reference({**flowrun, "kind": "FlowRun"}, controller=False)
            ],
        },
        "data": {SNAPSHOT_KEY: text},
    }
    collection = kube_client.path_of("configmaps", meta["namespace"])
    stored: dict[str, Any] = await objects.create_or_get(client, collection, body)
    if _is_own(stored, meta["uid"], digest_of(text)):
        return stored
    # someone else's: replace it (a create that loses a race again fails, and the reconcile
    # that called this retries)
    await client.delete(f"{collection}/{name}")
    created: dict[str, Any] = await client.create(collection, body)
    return created


def _is_own(config_map: Mapping[str, Any], run_uid: str, digest: str | None) -> bool:
    """Whether ``config_map`` is owned by the run and (when known) holds content ``digest``."""
    if not objects.owned_by(config_map, run_uid):
        return False
    text = (config_map.get("data") or {}).get(SNAPSHOT_KEY)
    return digest is None or (isinstance(text, str) and digest_of(text) == digest)


@dataclasses.dataclass
class RunSnapshot:
    """A snapshot as the runner reads it: the Flow to run and what it can reach."""

    flow: str
    flows: dict[str, Any]
    agents: dict[str, Any]
    #: The ConfigMap as read (its owners and content are what :meth:`check` verifies).
    config_map: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def check(self, flowrun: Mapping[str, Any]) -> None:
        """Raise :class:`SnapshotError` unless the operator wrote this snapshot for ``flowrun``.

        Owned by the FlowRun's uid, and holding the content ``status.snapshotDigest`` names
        (runs admitted before the operator stored a digest are checked by owner only).
        """
        meta = flowrun.get("metadata") or {}
        digest = (flowrun.get("status") or {}).get("snapshotDigest")
        if not _is_own(self.config_map, str(meta.get("uid") or ""), digest):
            name = (self.config_map.get("metadata") or {}).get("name", "")
            raise SnapshotError(
                f"ConfigMap {meta.get('namespace')}/{name} is not the snapshot the operator "
                f"wrote for this run (owned by FlowRun uid {meta.get('uid')}, content "
                f"{digest or 'as written'}): it is not used"
            )

    def resolver(self) -> graph.StaticResolver:
        """A resolver over the snapshot; raises pydantic's ValidationError on a bad spec."""
        return graph.StaticResolver.from_wire(self.agents, self.flows)


def read_mounted_snapshot(configmaps: mounted.Mounted, flowrun: Mapping[str, Any]) -> RunSnapshot:
    """The snapshot of ``flowrun`` from the pod's volume, checked against its digest.

    The kubelet read the ConfigMap by name, so its owner is not seen here: what proves the
    operator wrote it is ``status.snapshotDigest``, which the operator stores at admission and
    no runner may write. Raises :class:`SnapshotError` when it is missing, malformed or other
    content than the digest names.
    """
    meta = flowrun.get("metadata") or {}
    namespace, run = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    name = snapshot_name(run)
    text = configmaps.text(name, SNAPSHOT_KEY)
    if text is None:
        raise SnapshotError(f"ConfigMap {namespace}/{name} is missing from the pod")
    digest = (flowrun.get("status") or {}).get("snapshotDigest")
    if not digest or digest_of(text) != digest:
        raise SnapshotError(
            f"ConfigMap {namespace}/{name} is not the snapshot the operator wrote for this run "
            f"(content {digest or 'unknown: status.snapshotDigest is not set'}): it is not used"
        )
    return _parsed(text, namespace, run, {})


async def read_snapshot(client: kube_client.Client, namespace: str, run: str) -> RunSnapshot:
    """Read ``<run>-snapshot``; raise :class:`SnapshotError` when it is missing or malformed."""
    path = kube_client.path_of("configmaps", namespace, snapshot_name(run))
    try:
        obj = await client.get(path)
    except kube_client.ApiError as exc:
        if exc.not_found:
            raise SnapshotError(f"ConfigMap {namespace}/{snapshot_name(run)} is missing") from exc
        raise
    return _parsed((obj.get("data") or {}).get(SNAPSHOT_KEY), namespace, run, obj)


def _parsed(text: Any, namespace: str, run: str, config_map: dict[str, Any]) -> RunSnapshot:
    try:
        data = json.loads(text)
        return RunSnapshot(str(data["flow"]), dict(data["flows"]), dict(data["agents"]), config_map)
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(
            f'ConfigMap {namespace}/{snapshot_name(run)}: data["{SNAPSHOT_KEY}"] is not '
            f'{{"flow": NAME, "flows": {{...}}, "agents": {{...}}}}: {exc}'
        ) from exc
