"""A run's snapshot: the definitions it started with, the one owner of that concept.

A snapshot is the name of the run's Flow, and that Flow and every Agent and sub-flow it can
reach, as wire JSON by name.

A run never sees an edit made after it started: the host takes a :class:`Snapshot` when the run
starts and every later attempt (a new pod, ``agentflows resume``) runs from it. Its forms:

- the ConfigMap ``<run>-snapshot`` the operator writes and the runner reads
  (:mod:`agentflows.kube.snapshot`), ``data["snapshot.json"]`` = :attr:`Snapshot.text`, checked
  against ``status.snapshotDigest`` = :attr:`Snapshot.digest`;
- the local file ``<run>.snapshot.json`` (:mod:`agentflows.cli.local`): :attr:`Snapshot.document`
  plus how the local run runs;
- the operator's in-memory cache of them (:mod:`agentflows.controller.snapshots`).

The engine's resolver over one is :meth:`agentflows.engine.graph.StaticResolver.of_snapshot`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any

from agentflows.api import agent as agent_api
from agentflows.api import calls
from agentflows.api import flow as flow_api

#: The shape of :attr:`Snapshot.document`, for messages about one that is not.
SHAPE = '{"flow": NAME, "flows": {NAME: spec}, "agents": {NAME: spec}}'


def digest_of(text: str) -> str:
    """The content digest of a snapshot's JSON text as stored: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The definitions a run started with. Shared between runs and attempts, so read only.

    The specs are kept as wire JSON (what is stored) and parsed on first use: a spec that no
    longer validates is pydantic's ValidationError there, which a runner reports as FlowInvalid.
    """

    #: The name of the Flow the run runs (a key of :attr:`flows`).
    flow: str
    #: Flow specs by name, wire JSON.
    flows: dict[str, Any]
    #: Agent specs by name, wire JSON.
    agents: dict[str, Any]

    @classmethod
    def reached(cls, flow: str, lookup: calls.Lookup) -> Snapshot | None:
        """Flow ``flow`` and every Agent and sub-flow it reaches (:func:`calls.reach`).

        Every call counts, a tool node's Agent too (a runner needs its tool's definition); a
        reference not found is left out (compiling the Flow then names it). None when the Flow
        itself is not found.
        """
        found = calls.reach(flow, lookup)
        if flow not in found.flows:
            return None
        snapshot = cls(
            flow,
            {name: spec.to_wire() for name, spec in found.flows.items()},
            {name: spec.to_wire() for name, spec in found.agents.items()},
        )
        # the wire JSON was made from these specs: keep them (the cached properties' values)
        # rather than parse it again
        snapshot.__dict__.update(flow_specs=dict(found.flows), agent_specs=dict(found.agents))
        return snapshot

    @classmethod
    def from_document(cls, document: Any) -> Snapshot:
        """The snapshot :attr:`document` ``document`` holds; a ValueError saying what is wrong."""
        if not isinstance(document, dict):
            raise ValueError(f"not a JSON object {SHAPE}")
        for key, kind in (("flow", str), ("flows", dict), ("agents", dict)):
            if key not in document:
                raise ValueError(f"{key!r} is missing")
            if not isinstance(document[key], kind):
                what = "a string" if kind is str else "a JSON object"
                raise ValueError(f"{key!r} must be {what}")
        return cls(document["flow"], dict(document["flows"]), dict(document["agents"]))

    @property
    def document(self) -> dict[str, Any]:
        """The JSON value stored: ``{"flow": NAME, "flows": {...}, "agents": {...}}``."""
        return {"flow": self.flow, "flows": self.flows, "agents": self.agents}

    @functools.cached_property
    def text(self) -> str:
        """The JSON text the operator stores (keys sorted, so equal snapshots are equal text)."""
        return json.dumps(self.document, ensure_ascii=False, sort_keys=True)

    @functools.cached_property
    def digest(self) -> str:
        """The content digest of :attr:`text` (``status.snapshotDigest``)."""
        return digest_of(self.text)

    @functools.cached_property
    def agent_specs(self) -> dict[str, agent_api.AgentSpec]:
        """The Agent specs, parsed; pydantic's ValidationError on one that does not validate."""
        return {name: agent_api.AgentSpec.model_validate(s) for name, s in self.agents.items()}

    @functools.cached_property
    def flow_specs(self) -> dict[str, flow_api.FlowSpec]:
        """The Flow specs, parsed; pydantic's ValidationError on one that does not validate."""
        return {name: flow_api.FlowSpec.model_validate(s) for name, s in self.flows.items()}

    @property
    def flow_spec(self) -> flow_api.FlowSpec:
        """The run's Flow, parsed; KeyError when :attr:`flows` does not hold it.

        One :meth:`reached` made always does; one read back is checked by its reader.
        """
        return self.flow_specs[self.flow]
