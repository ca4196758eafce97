"""Checkpoint stores: where a run's durable state lives between node executions.

The engine hands every node result to the store before starting the node's dependants, so a
runner that stops at any moment loses at most the nodes that were running. A new runner calls
:meth:`CheckpointStore.load` and never re-executes a node recorded as finished.

Backends: :class:`MemoryStore` (tests, benchmarks), :class:`FileStore` (local runs; one JSON
file per run) and, outside the engine, the FlowRun status store in ``agentflows.kube``. All
pass the contract suite in ``tests/unit/engine/store_contract.py``.

Humans write decisions into requests through the backend's own channel (a status patch, or
``agentflows resume`` for files); the engine only reads them on load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from agentflows.api import common, errors
from agentflows.api import flowrun as flowrun_api


@dataclasses.dataclass
class RunRecord:
    """Facts fixed when a run starts."""

    name: str
    input: Any
    trigger: Any
    started_at: str

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Outcome:
    """How a run ended (or paused)."""

    phase: flowrun_api.RunPhase
    output: Any = None
    message: str | None = None
    reason: str | None = None
    completed_at: str | None = None
    usage: common.Usage = dataclasses.field(default_factory=common.Usage)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "phase": self.phase.value,
            "output": self.output,
            "message": self.message,
            "reason": self.reason,
            "completedAt": self.completed_at,
            "usage": self.usage.to_wire(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        """Parse the JSON form."""
        return cls(
            phase=flowrun_api.RunPhase(data["phase"]),
            output=data.get("output"),
            message=data.get("message"),
            reason=data.get("reason"),
            completed_at=data.get("completedAt"),
            usage=common.Usage.model_validate(data.get("usage") or {}),
        )


@dataclasses.dataclass
class Checkpoint:
    """Everything a store holds for one run."""

    run: RunRecord | None = None
    nodes: dict[str, flowrun_api.NodeStatus] = dataclasses.field(default_factory=dict)
    requests: dict[str, flowrun_api.HumanRequest] = dataclasses.field(default_factory=dict)
    outcome: Outcome | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form (the file store's format)."""
        return {
            "run": self.run.to_json() if self.run else None,
            "nodes": {k: v.to_wire() for k, v in self.nodes.items()},
            "requests": {k: v.to_wire() for k, v in self.requests.items()},
            "outcome": self.outcome.to_json() if self.outcome else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        """Parse the JSON form."""
        run = data.get("run")
        outcome = data.get("outcome")
        return cls(
            run=RunRecord(**run) if run else None,
            nodes={
                k: flowrun_api.NodeStatus.model_validate(v)
                for k, v in (data.get("nodes") or {}).items()
            },
            requests={
                k: flowrun_api.HumanRequest.model_validate(v)
                for k, v in (data.get("requests") or {}).items()
            },
            outcome=Outcome.from_json(outcome) if outcome else None,
        )


class CheckpointStore(Protocol):
    """The narrow interface the engine persists a run through."""

    async def load(self) -> Checkpoint:
        """Everything saved so far (an empty Checkpoint for a new run)."""
        ...

    async def save_run(self, record: RunRecord) -> None:
        """Record the run's fixed facts (called once, when the run starts)."""
        ...

    async def save_node(self, key: str, status: flowrun_api.NodeStatus) -> None:
        """Record a node's state; a finished node's record is final."""
        ...

    async def fold_nodes(
        self, folded: dict[str, flowrun_api.NodeStatus], removed: Sequence[str]
    ) -> None:
        """Remove the finished records ``removed`` and write ``folded`` in their place, at once.

        One write: a store stopped at any moment holds either every change or none. The engine
        folds a loop's older iterations (:data:`~agentflows.api.flowrun.ITERATIONS_KEPT`).
        """
        ...

    async def save_request(self, request_id: str, request: flowrun_api.HumanRequest) -> None:
        """Record a new human request (the decision fields stay the human's)."""
        ...

    async def save_outcome(self, outcome: Outcome) -> None:
        """Record how the run ended or paused."""
        ...


class MemoryStore:
    """A store in memory, for tests and benchmarks.

    Saves keep the records given (the engine never mutates a record after saving it: it makes
    a new one), and :meth:`load` returns deep copies, as a new runner would read them.
    """

    def __init__(self) -> None:
        self.checkpoint = Checkpoint()
        #: Number of save calls, by method: lets tests count writes per node.
        self.writes: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.writes[name] = self.writes.get(name, 0) + 1

    async def load(self) -> Checkpoint:
        """A deep copy of the stored checkpoint."""
        return Checkpoint.from_json(json.loads(json.dumps(self.checkpoint.to_json())))

    async def save_run(self, record: RunRecord) -> None:
        """Keep the run record."""
        self._count("run")
        self.checkpoint.run = dataclasses.replace(record)

    async def save_node(self, key: str, status: flowrun_api.NodeStatus) -> None:
        """Keep a copy of the node record."""
        self._count("node")
        self.checkpoint.nodes[key] = status

    async def fold_nodes(
        self, folded: dict[str, flowrun_api.NodeStatus], removed: Sequence[str]
    ) -> None:
        """Drop the records ``removed`` and keep the ``folded`` ones."""
        self._count("fold")
        _fold(self.checkpoint, folded, removed)

    async def save_request(self, request_id: str, request: flowrun_api.HumanRequest) -> None:
        """Keep a new request without overwriting a decision already made."""
        self._count("request")
        self.checkpoint.requests[request_id] = _merge_request(
            self.checkpoint.requests.get(request_id), request
        )

    async def save_outcome(self, outcome: Outcome) -> None:
        """Keep the outcome."""
        self._count("outcome")
        self.checkpoint.outcome = dataclasses.replace(outcome)

    async def decide(self, request_id: str, **fields: Any) -> None:
        """Write a human's decision (what ``kubectl patch`` does for the status store)."""
        request = self.checkpoint.requests[request_id]
        self.checkpoint.requests[request_id] = with_decision(request, fields)


def _fold(
    checkpoint: Checkpoint, folded: dict[str, flowrun_api.NodeStatus], removed: Sequence[str]
) -> None:
    for key in removed:
        checkpoint.nodes.pop(key, None)
    checkpoint.nodes.update(folded)


def with_decision(
    request: flowrun_api.HumanRequest, fields: dict[str, Any]
) -> flowrun_api.HumanRequest:
    """The request with a human's fields set, validated (a bad decision raises)."""
    data = request.model_dump(by_alias=False)
    data.update(fields)
    return flowrun_api.HumanRequest.model_validate(data)


_HUMAN_FIELDS = ("decision", "edits", "data", "comment", "decided_by", "decided_at")


def _merge_request(
    old: flowrun_api.HumanRequest | None, new: flowrun_api.HumanRequest
) -> flowrun_api.HumanRequest:
    if old is None:
        return new.model_copy(deep=True)
    keep = {f: getattr(old, f) for f in _HUMAN_FIELDS if getattr(old, f) is not None}
    return new.model_copy(update=keep, deep=True)


class StateFileError(errors.AgentflowsError, ValueError):
    """A state file that is not a run's state; the message names the file and what is wrong."""


def _checked_json(path: Path, data: Any) -> dict[str, Any]:
    """``data`` when it has the shape of a checkpoint's JSON form, else a StateFileError."""
    if not isinstance(data, dict):
        raise StateFileError(
            f"{path}: not a run state: a JSON object is expected, not {data!r:.60}"
        )
    for key in ("run", "nodes", "requests", "outcome"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise StateFileError(
                f"{path}: not a run state: {key!r} must be a JSON object, not {data[key]!r:.60}"
            )
    return data


class FileStore:
    """A store in one JSON file plus an append-only journal beside it (local runs).

    ``agentflows run`` writes ``<state-dir>/<run>.json`` and ``agentflows resume`` reads it back.
    A save appends one JSON line to ``.<run>.json.journal``, so a save costs the size of its
    record, not of the run (a map over thousands of items would otherwise rewrite the whole
    state per item). :meth:`load`, :meth:`save_outcome` and :meth:`decide` compact: they write
    the state file atomically (temp file + rename) and only then drop the journal.

    Crash safety: the state file is only ever replaced whole; a journal line cut short by a
    killed process is the last one and is ignored; replaying a journal over a state file that
    already holds it changes nothing (a later record of a key replaces an earlier one, and a
    request keeps the decision already made). Text is written ASCII-escaped, so any string the
    engine holds, a lone surrogate included, round-trips.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path.with_name(f".{path.name}.journal")
        self._lock = asyncio.Lock()

    def read(self) -> Checkpoint:
        """Read the state file and replay its journal synchronously (CLI commands that look).

        A file that is not a run's state raises :class:`StateFileError` naming it.
        """
        try:
            checkpoint = (
                Checkpoint.from_json(
                    _checked_json(self.path, json.loads(self.path.read_text(encoding="utf-8")))
                )
                if self.path.exists()
                else Checkpoint()
            )
            for entry in self._journal_entries():
                _replay(checkpoint, _checked_json(self.journal, entry))
        except StateFileError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StateFileError(f"{self.path}: not a run state: {exc}") from exc
        return checkpoint

    def _journal_entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.journal.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except ValueError:
                break  # the tail of a write a killed process left unfinished
        return entries

    def _compact(self, checkpoint: Checkpoint) -> None:
        """Write the whole state atomically, then drop the journal it now holds."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                # dumps, not dump(indent=...): only the one-shot encoder is the C one
                handle.write(json.dumps(checkpoint.to_json(), separators=(",", ":")))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.journal.unlink(missing_ok=True)

    async def _append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        async with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.journal.open("a", encoding="ascii") as handle:
                handle.write(line)

    async def _update(self, change: Any) -> None:
        async with self._lock:
            checkpoint = self.read()
            change(checkpoint)
            self._compact(checkpoint)

    async def load(self) -> Checkpoint:
        """Read the state, compacting the journal into the state file first."""
        async with self._lock:
            checkpoint = self.read()
            if self.journal.exists():
                self._compact(checkpoint)
            return checkpoint

    async def save_run(self, record: RunRecord) -> None:
        """Append the run record."""
        await self._append({"run": record.to_json()})

    async def save_node(self, key: str, status: flowrun_api.NodeStatus) -> None:
        """Append a node record."""
        await self._append({"node": key, "status": status.to_wire()})

    async def fold_nodes(
        self, folded: dict[str, flowrun_api.NodeStatus], removed: Sequence[str]
    ) -> None:
        """Append the fold as one journal line, so a replay applies all of it or none."""
        records = {k: v.to_wire() for k, v in folded.items()}
        await self._append({"fold": records, "removed": list(removed)})

    async def save_request(self, request_id: str, request: flowrun_api.HumanRequest) -> None:
        """Append a new request (a decision already in the state is kept on replay)."""
        await self._append({"request": request_id, "value": request.to_wire()})

    async def save_outcome(self, outcome: Outcome) -> None:
        """Write the outcome and compact: a run that ended or paused leaves one file."""
        await self._update(lambda c: setattr(c, "outcome", outcome))

    async def decide(self, request_id: str, **fields: Any) -> None:
        """Write a human's decision into a request (``agentflows resume``)."""

        def change(checkpoint: Checkpoint) -> None:
            request = checkpoint.requests[request_id]
            checkpoint.requests[request_id] = with_decision(request, fields)

        await self._update(change)


def _replay(checkpoint: Checkpoint, entry: dict[str, Any]) -> None:
    """Apply one journal entry written by :class:`FileStore`."""
    if "run" in entry:
        checkpoint.run = RunRecord(**entry["run"])
    elif "node" in entry:
        checkpoint.nodes[entry["node"]] = flowrun_api.NodeStatus.model_validate(entry["status"])
    elif "fold" in entry:
        folded = {k: flowrun_api.NodeStatus.model_validate(v) for k, v in entry["fold"].items()}
        _fold(checkpoint, folded, entry["removed"])
    elif "request" in entry:
        request = flowrun_api.HumanRequest.model_validate(entry["value"])
        request_id = entry["request"]
        checkpoint.requests[request_id] = _merge_request(
            checkpoint.requests.get(request_id), request
        )
