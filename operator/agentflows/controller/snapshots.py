"""The run snapshot, as the operator uses it: built from the cache, written once, parsed once.

A thin layer over :class:`agentflows.api.snapshot.Snapshot` and its ConfigMap form
:mod:`agentflows.kube.snapshot` (the ConfigMap ``<run>-snapshot`` and its layout are defined
there and in ``kube/NOTES.md``). What a Flow reaches is the same for every run started while
none of it changes, so the snapshot, its JSON and its parsed specs are built once per version of
what it reaches (:class:`Snapshots`) and shared by those runs. A run's snapshot is kept by run
uid from when it is written until the run finishes; after an operator restart it is read back
once, and used only when it is the one the operator wrote for the run (owned by the run's uid,
with the content digest kept in ``status.snapshotDigest``). A run's snapshot is written at
admission only (whatever held its name before is replaced), so edits to a Flow never change a
started run and a restarted operator stays idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflows.agents import sessions
from agentflows.api import agent as agent_api
from agentflows.api import snapshot as snapshot_api
from agentflows.controller import cache
from agentflows.kube import client as kube
from agentflows.kube import snapshot as kube_snapshot

#: Versions of reachable specs kept (each is shared by every run started from it), and
#: snapshots' memories kept.
_MAX_BUILT = 256


def _version(
    store: cache.Cache, namespace: str, snapshot: snapshot_api.Snapshot
) -> tuple[Any, ...]:
    """What the snapshot was built from: each reached Flow's and Agent's uid and generation."""
    parts: list[tuple[str, str, str, int]] = []
    for kind, names in (("Flow", snapshot.flows), ("Agent", snapshot.agents)):
        for name in sorted(names):
            found = store.flow(namespace, name) if kind == "Flow" else store.agent(namespace, name)
            if found is not None:
                parts.append((kind, name, found.uid, found.generation))
    return tuple(parts)


class Snapshots:
    """Snapshots built (by what they reach) and snapshots of runs (by run uid)."""

    def __init__(self, store: cache.Cache) -> None:
        self._cache = store
        self._built: dict[tuple[str, str], tuple[tuple[Any, ...], snapshot_api.Snapshot]] = {}
        #: (namespace, run) -> (run uid, its snapshot)
        self._runs: dict[tuple[str, str], tuple[str, snapshot_api.Snapshot]] = {}
        #: digest -> the memories its runs' turns may write
        self._memories: dict[str, Mapping[str, agent_api.AgentMemory]] = {}

    def build(self, namespace: str, flow: str) -> snapshot_api.Snapshot:
        """The snapshot of ``flow`` as the cache has it now (shared while nothing changes)."""
        known = self._built.get((namespace, flow))
        if known is not None and known[0] == _version(self._cache, namespace, known[1]):
            return known[1]
        built = kube_snapshot.build_snapshot(flow, self._cache.namespace(namespace).resolver())
        if len(self._built) >= _MAX_BUILT:
            self._built.pop(next(iter(self._built)))
        self._built[(namespace, flow)] = (_version(self._cache, namespace, built), built)
        return built

    async def ensure(
        self, api: kube.Client, run: dict[str, Any], built: snapshot_api.Snapshot
    ) -> snapshot_api.Snapshot:
        """Write ``built`` as the run's snapshot (replacing anything else there); keep it."""
        await kube_snapshot.write_snapshot(api, run, built)
        self._keep(run, built)
        return built

    def _keep(self, run: dict[str, Any], snapshot: snapshot_api.Snapshot) -> None:
        meta = run["metadata"]
        self._runs[(meta["namespace"], meta["name"])] = (meta["uid"], snapshot)

    async def of_run(self, api: kube.Client, run: dict[str, Any]) -> snapshot_api.Snapshot | None:
        """The run's snapshot (read once after a restart), its specs parsed.

        None when it is missing, malformed (a spec that does not validate, no Flow of the run's
        name in it), or not the one the operator wrote for the run.
        """
        meta = run["metadata"]
        known = self._runs.get((meta["namespace"], meta["name"]))
        if known is not None and known[0] == meta["uid"]:
            return known[1]
        try:
            snapshot = await kube_snapshot.read_own_snapshot(api, run)
            # parse it now, the Flow first: one that does not parse is no snapshot of the run
            _ = snapshot.flow_spec, snapshot.agent_specs
        except (kube_snapshot.SnapshotError, KeyError, ValueError):
            return None
        self._keep(run, snapshot)
        return snapshot

    def memories(self, snapshot: snapshot_api.Snapshot) -> Mapping[str, agent_api.AgentMemory]:
        """The memories its runs' turns may write, with their bounds (:func:`sessions.memories`).

        Walked once per snapshot: each attempt's sessions grant and the retention noted when a
        run finishes read it, and a built snapshot is shared by every run started from it.
        Shared, so read only.
        """
        found = self._memories.get(snapshot.digest)
        if found is None:
            found = sessions.memories(snapshot.flow_specs, snapshot.agent_specs)
            if len(self._memories) >= _MAX_BUILT:
                self._memories.pop(next(iter(self._memories)))
            self._memories[snapshot.digest] = found
        return found

    def forget(self, namespace: str, run: str) -> None:
        """A run finished or is gone: its snapshot is not needed any more."""
        self._runs.pop((namespace, run), None)
