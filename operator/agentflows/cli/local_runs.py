"""Local runs as FlowRun objects, so ``list``, ``get`` and ``requests`` show them as on a cluster.

A local run is the pair of files :mod:`agentflows.cli.local` writes in the state directory.
:func:`read` turns them into the FlowRun a cluster would hold for the same run: the checkpoint's
nodes, requests and outcome become ``status``; ``status.duration`` and ``status.currentNode``
are computed when read (on a cluster the operator and the runner write them). There is no
namespace and no attempt; a local run is a manual run.

The phase is the checkpoint's outcome, else ``Running`` (a run in progress in another shell, or
one whose process was killed; ``agentflows resume`` continues either) — ``Pending`` with reason
``Interrupted`` after Ctrl-C (:func:`save_interrupted`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentflows import api as api_group
from agentflows.api import errors, times
from agentflows.api import flowrun as flowrun_api
from agentflows.cli import local
from agentflows.engine import run as run_mod
from agentflows.engine import store


class StateError(errors.AgentflowsError):
    """A run's state files cannot be read; the message names the file."""


def names(directory: Path) -> list[str]:
    """Names of the runs kept in ``directory`` (none when it does not exist)."""
    if not directory.is_dir():
        return []
    suffix = local.SNAPSHOT_SUFFIX
    return sorted(p.name[: -len(suffix)] for p in directory.glob(f"*{suffix}") if p.is_file())


def read(directory: Path, name: str) -> dict[str, Any] | None:
    """Run ``name`` as a FlowRun object, or None when there is no such run."""
    snapshot_file = local.snapshot_path(directory, name)
    if not snapshot_file.is_file():
        return None
    try:
        started = local.SnapshotFile.load(snapshot_file)
        checkpoint = store.FileStore(local.state_path(directory, name)).read()
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read run {name}: {exc}") from exc
    return as_flowrun(name, started.snapshot.flow, checkpoint)


def read_all(directory: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every run in ``directory`` as FlowRun objects, and why each unreadable one was skipped."""
    runs, problems = [], []
    for name in names(directory):
        try:
            run = read(directory, name)
        except StateError as exc:
            problems.append(str(exc))
            continue
        except local.UsageError as exc:  # a file put there by hand, under a name no run has
            problems.append(f"{directory / (name + local.SNAPSHOT_SUFFIX)}: {exc}")
            continue
        if run is not None:
            runs.append(run)
    return runs, problems


def as_flowrun(name: str, flow: str, checkpoint: store.Checkpoint) -> dict[str, Any]:
    """The FlowRun object of a local run."""
    record = checkpoint.run
    outcome = checkpoint.outcome
    started = record.started_at if record else None
    if outcome is not None:
        phase = outcome.phase.value
    else:
        phase = (flowrun_api.RunPhase.RUNNING if record else flowrun_api.RunPhase.PENDING).value
    nodes = {k: v.to_wire() for k, v in checkpoint.nodes.items()}
    status: dict[str, Any] = {
        "phase": phase,
        "reason": outcome.reason if outcome else None,
        "message": outcome.message if outcome else None,
        "startTime": started,
        "completionTime": outcome.completed_at if outcome else None,
        "duration": times.duration(started, outcome.completed_at if outcome else None),
        "currentNode": next(
            (k for k, n in nodes.items() if n["phase"] == flowrun_api.NodePhase.RUNNING), None
        ),
        "nodes": nodes,
        "requests": {k: v.to_wire() for k, v in checkpoint.requests.items()},
        "output": outcome.output if outcome else None,
        "usage": outcome.usage.to_wire() if outcome else None,
    }
    return {
        "apiVersion": api_group.API_VERSION,
        "kind": "FlowRun",
        "metadata": {"name": name, "creationTimestamp": started},
        "spec": {
            "flow": flow,
            "input": record.input if record else None,
            "trigger": (record.trigger if record else None) or {"type": "manual"},
        },
        "status": {k: v for k, v in status.items() if v is not None},
    }


def save_interrupted(directory: Path, name: str) -> None:
    """Record that run ``name`` was stopped by Ctrl-C, keeping it resumable.

    The phase is Pending (not terminal), so ``agentflows resume`` continues the run without
    re-running its finished nodes.
    """
    file_store = store.FileStore(local.state_path(directory, name))
    outcome = store.Outcome(
        flowrun_api.RunPhase.PENDING,
        message=f"interrupted (Ctrl-C); agentflows resume {name} continues it",
        reason=flowrun_api.RunReason.INTERRUPTED,
        usage=run_mod.total_usage(file_store.read()),
    )
    asyncio.run(file_store.save_outcome(outcome))


def flows(directory: Path, name: str) -> dict[str, Any]:
    """The Flow specs run ``name`` started with, by name (none when it cannot be read)."""
    try:
        return dict(local.SnapshotFile.load(local.snapshot_path(directory, name)).snapshot.flows)
    except (OSError, ValueError, TypeError):
        return {}


def changed_at(directory: Path, name: str) -> int | None:
    """When run ``name``'s checkpoint file last changed, in ns (None: not written yet)."""
    try:
        return local.state_path(directory, name).stat().st_mtime_ns
    except OSError:
        return None
