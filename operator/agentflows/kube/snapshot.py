"""The ConfigMap form of a run's snapshot (:class:`agentflows.api.snapshot.Snapshot`).

The operator calls :func:`build_snapshot` (fed from the API through a plain lookup) and
:func:`write_snapshot` before it creates the first runner pod; the runner calls
:func:`read_mounted_snapshot`. The ConfigMap ``<run>-snapshot`` is owned by the FlowRun and holds
``data["snapshot.json"]`` = :attr:`Snapshot.text <agentflows.api.snapshot.Snapshot.text>`,
``{"flow": NAME, "flows": {NAME: spec}, "agents": {NAME: spec}}`` (wire JSON of the specs), the
same document as the local ``<run>.snapshot.json`` of :mod:`agentflows.cli.local`. Edits to a
Flow or an Agent never change a started run.

Only a snapshot the operator wrote for the run counts: owned by the FlowRun's uid and, once
the operator stored it in ``status.snapshotDigest``, with that content digest
(:func:`agentflows.api.snapshot.digest_of`). Whoever else could write a ConfigMap of that name (a
namespace editor; a runner is refused by ``config/policies/runner_own_run.yaml``) cannot make a
run start from what they wrote: at admission the operator replaces any other ConfigMap of that
name with its own (:func:`write_snapshot`), and later the operator (:func:`read_own_snapshot`)
and the runner (:func:`read_mounted_snapshot`) refuse one that does not match.

A reference that cannot be resolved is left out rather than refused: compiling the Flow in
the runner then fails the run with reason FlowInvalid and a message naming the missing
Agent or Flow, which is where a user looks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentflows.api import calls, errors
from agentflows.api import snapshot as snapshot_api
from agentflows.kube import client as kube_client
from agentflows.kube import mounted, objects

#: The ConfigMap key holding the snapshot JSON.
SNAPSHOT_KEY = "snapshot.json"


class SnapshotError(errors.AgentflowsError):
    """The snapshot cannot be built or read (permanent: the run cannot start from it)."""


def snapshot_name(run: str) -> str:
    """Name of the snapshot ConfigMap of run ``run``."""
    return objects.snapshot_name(run)


def build_snapshot(flow_name: str, lookup: calls.Lookup) -> snapshot_api.Snapshot:
    """The snapshot of Flow ``flow_name`` (:meth:`~agentflows.api.snapshot.Snapshot.reached`).

    Raises :class:`SnapshotError` when the Flow itself does not exist.
    """
    built = snapshot_api.Snapshot.reached(flow_name, lookup)
    if built is None:
        raise SnapshotError(f'no Flow "{flow_name}"')
    return built


async def write_snapshot(
    client: kube_client.Client, flowrun: Mapping[str, Any], snapshot: snapshot_api.Snapshot
) -> dict[str, Any]:
    """Create ``<run>-snapshot`` owned by the FlowRun and return it as stored.

    Called at admission, before any runner of the run exists, so what the operator built is the
    run's snapshot: a ConfigMap of that name already holding exactly it and owned by the run is
    kept (an admission cut short and retried), any other one is deleted and written again.
    """
    meta = flowrun["metadata"]
    run = meta["name"]
    name = snapshot_name(run)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": objects.run_labels(run, snapshot.flow),
            "ownerReferences": [
                objects.owner_reference({**flowrun, "kind": "FlowRun"}, controller=False)
            ],
        },
        "data": {SNAPSHOT_KEY: snapshot.text},
    }
    collection = kube_client.path_of("configmaps", meta["namespace"])
    stored: dict[str, Any] = await objects.create_or_get(client, collection, body)
    if _is_own(stored, meta["uid"], snapshot.digest):
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
    return digest is None or (isinstance(text, str) and snapshot_api.digest_of(text) == digest)


def read_mounted_snapshot(
    configmaps: mounted.Mounted, flowrun: Mapping[str, Any]
) -> snapshot_api.Snapshot:
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
    if not digest or snapshot_api.digest_of(text) != digest:
        raise SnapshotError(
            f"ConfigMap {namespace}/{name} is not the snapshot the operator wrote for this run "
            f"(content {digest or 'unknown: status.snapshotDigest is not set'}): it is not used"
        )
    return _parsed(text, namespace, run)


async def read_snapshot(
    client: kube_client.Client, namespace: str, run: str
) -> snapshot_api.Snapshot:
    """Read ``<run>-snapshot`` whoever wrote it (to draw a run, not to run it).

    Raises :class:`SnapshotError` when it is missing or malformed.
    """
    config_map = await _read(client, namespace, run)
    return _parsed((config_map.get("data") or {}).get(SNAPSHOT_KEY), namespace, run)


async def read_own_snapshot(
    client: kube_client.Client, flowrun: Mapping[str, Any]
) -> snapshot_api.Snapshot:
    """Read the snapshot the operator wrote for ``flowrun``.

    Raises :class:`SnapshotError` when it is missing or malformed, or unless it is owned by the
    FlowRun's uid and holds the content ``status.snapshotDigest`` names (runs admitted before
    the operator stored a digest are checked by owner only).
    """
    meta = flowrun.get("metadata") or {}
    namespace, run = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    config_map = await _read(client, namespace, run)
    digest = (flowrun.get("status") or {}).get("snapshotDigest")
    if not _is_own(config_map, str(meta.get("uid") or ""), digest):
        raise SnapshotError(
            f"ConfigMap {namespace}/{snapshot_name(run)} is not the snapshot the operator "
            f"wrote for this run (owned by FlowRun uid {meta.get('uid')}, content "
            f"{digest or 'as written'}): it is not used"
        )
    return _parsed((config_map.get("data") or {}).get(SNAPSHOT_KEY), namespace, run)


async def _read(client: kube_client.Client, namespace: str, run: str) -> dict[str, Any]:
    path = kube_client.path_of("configmaps", namespace, snapshot_name(run))
    try:
        found: dict[str, Any] = await client.get(path)
    except kube_client.ApiError as exc:
        if exc.not_found:
            raise SnapshotError(f"ConfigMap {namespace}/{snapshot_name(run)} is missing") from exc
        raise
    return found


def _parsed(text: Any, namespace: str, run: str) -> snapshot_api.Snapshot:
    try:
        return snapshot_api.Snapshot.from_document(json.loads(text))
    except (TypeError, ValueError) as exc:
        raise SnapshotError(
            f'ConfigMap {namespace}/{snapshot_name(run)}: data["{SNAPSHOT_KEY}"] is not '
            f"{snapshot_api.SHAPE}: {exc}"
        ) from exc
