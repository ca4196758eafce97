"""The run snapshot, as the operator uses it: built from the cache, written once, parsed once.

A thin layer over :mod:`agentflows.kube.snapshot` (the ConfigMap ``<run>-snapshot`` and its
layout are defined there and in ``kube/NOTES.md``). What a Flow reaches is the same for every run
started while none of it changes, so the document, its JSON and its parsed specs are built once
per version of what it reaches (:class:`Snapshots`) and shared by those runs. A run's snapshot
is kept by run uid from when it is written until the run finishes; after an operator restart it
is read back once, and used only when it is the one the operator wrote for the run (owned by
the run's uid, with the content digest kept in ``status.snapshotDigest``). A run's snapshot is
written at admission only (whatever held its name before is replaced), so edits to a Flow never
change a started run and a restarted operator stays idempotent.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.controller import cache
from agentflows.kube import client as kube
from agentflows.kube import snapshot as kube_snapshot

#: Versions of reachable specs kept (each is shared by every run started from it).
_MAX_BUILT = 256


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A snapshot document and its specs, parsed."""

    document: dict[str, Any]
    flow: flow_api.FlowSpec
    flows: dict[str, flow_api.FlowSpec]
    agents: dict[str, agent_api.AgentSpec]

    @classmethod
    def parse(cls, document: dict[str, Any]) -> Snapshot:
        """Parse a snapshot document; raises pydantic's ValidationError or KeyError."""
        flows = {
            name: flow_api.FlowSpec.model_validate(spec)
            for name, spec in document.get("flows", {}).items()
        }
        agents = {
            name: agent_api.AgentSpec.model_validate(spec)
            for name, spec in document.get("agents", {}).items()
        }
        return cls(document, flows[document["flow"]], flows, agents)

    @functools.cached_property
    def digest(self) -> str:
        """The content digest of the document as written (``status.snapshotDigest``)."""
        return kube_snapshot.digest_of(
            json.dumps(self.document, ensure_ascii=False, sort_keys=True)
        )


def name_of(run_name: str) -> str:
    """The snapshot ConfigMap's name."""
    return kube_snapshot.snapshot_name(run_name)


def _version(store: cache.Cache, namespace: str, document: dict[str, Any]) -> tuple[Any, ...]:
    """What the document was built from: each reached Flow's and Agent's uid and generation."""
    parts: list[tuple[str, str, str, int]] = []
    for kind, names in (("Flow", document["flows"]), ("Agent", document["agents"])):
        for name in sorted(names):
            found = store.flow(namespace, name) if kind == "Flow" else store.agent(namespace, name)
            if found is not None:
                parts.append((kind, name, found.uid, found.generation))
    return tuple(parts)


class Snapshots:
    """Snapshots built (by what they reach) and snapshots of runs (by run uid)."""

    def __init__(self, store: cache.Cache) -> None:
        self._cache = store
        self._built: dict[tuple[str, str], tuple[tuple[Any, ...], Snapshot]] = {}
        #: (namespace, run) -> (run uid, its snapshot)
        self._runs: dict[tuple[str, str], tuple[str, Snapshot]] = {}

    def build(self, namespace: str, flow: str) -> Snapshot:
        """The snapshot of ``flow`` as the cache has it now (shared while nothing changes)."""
        known = self._built.get((namespace, flow))
        if known is not None and known[0] == self._reached_version(namespace, known[1]):
            return known[1]
        ns = self._cache.namespace(namespace)
        document = kube_snapshot.build_snapshot(flow, ns.resolver())
        flows = {name: ns.flows[name] for name in document["flows"]}
        agents = {name: ns.agents[name] for name in document["agents"]}
        built = Snapshot(document, flows[flow], flows, agents)
        if len(self._built) >= _MAX_BUILT:
            self._built.pop(next(iter(self._built)))
        self._built[(namespace, flow)] = (_version(self._cache, namespace, built.document), built)
        return built

    def _reached_version(self, namespace: str, built: Snapshot) -> tuple[Any, ...]:
        return _version(self._cache, namespace, built.document)

    async def ensure(self, api: kube.Client, run: dict[str, Any], built: Snapshot) -> Snapshot:
        """Write ``built`` as the run's snapshot (replacing anything else there); keep it."""
        await kube_snapshot.write_snapshot(api, run, built.document)
        self._keep(run, built)
        return built

    def _keep(self, run: dict[str, Any], snapshot: Snapshot) -> None:
        meta = run["metadata"]
        self._runs[(meta["namespace"], meta["name"])] = (meta["uid"], snapshot)

    async def of_run(self, api: kube.Client, run: dict[str, Any]) -> Snapshot | None:
        """The run's snapshot (read once after a restart).

        None when it is missing, malformed, or not the one the operator wrote for the run.
        """
        meta = run["metadata"]
        known = self._runs.get((meta["namespace"], meta["name"]))
        if known is not None and known[0] == meta["uid"]:
            return known[1]
        try:
            found = await kube_snapshot.read_snapshot(api, meta["namespace"], meta["name"])
            found.check(run)
            snapshot = Snapshot.parse(
                {"flow": found.flow, "flows": found.flows, "agents": found.agents}
            )
        except (kube_snapshot.SnapshotError, KeyError, ValueError):
            return None
        self._keep(run, snapshot)
        return snapshot

    def forget(self, namespace: str, run: str) -> None:
        """A run finished or is gone: its snapshot is not needed any more."""
        self._runs.pop((namespace, run), None)
