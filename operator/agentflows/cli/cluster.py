"""Cluster commands of the CLI: start, get, watch and logs, over the kube client.

They talk to the API server with the caller's kubeconfig, so they can do exactly what the
caller's RBAC allows. Offloaded outputs (``outputRef``) are fetched back from their ConfigMaps
so ``agentflows get`` always shows the whole output.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from agentflows.api import flowrun as flowrun_api
from agentflows.kube import client as kube

#: The phases a run's follower stops at: the run is over, or waits for a human.
_SETTLED = flowrun_api.TERMINAL_PHASES | {flowrun_api.RunPhase.WAITING.value}


def run_path(namespace: str, name: str | None = None) -> str:
    """API path of FlowRuns."""
    return kube.path_of("flowruns", namespace, name)


async def get_run(api: kube.Client, namespace: str, name: str) -> dict[str, Any]:
    """The FlowRun object."""
    found: dict[str, Any] = await api.get(run_path(namespace, name))
    return found


async def resolve_outputs(
    api: kube.Client, namespace: str, run: dict[str, Any]
) -> flowrun_api.FlowRunStatus:
    """The run's status with every offloaded output read back in place."""
    from agentflows.kube import status_store

    status = flowrun_api.status_of(run)
    nodes = {}
    for key, record in status.nodes.items():
        if record.output_ref:
            output = await status_store.read_output(api, namespace, record.output_ref)
            record = record.model_copy(update={"output": output})
        nodes[key] = record
    resolved: dict[str, Any] = {"nodes": nodes}
    if status.output_ref:
        resolved["output"] = await status_store.read_output(api, namespace, status.output_ref)
    return status.model_copy(update=resolved)


def _settled(run: dict[str, Any]) -> bool:
    """Whether ``follow`` stops at the run: it is finished or waits for a human."""
    return flowrun_api.status_of(run).phase in _SETTLED


async def follow(
    api: kube.Client, namespace: str, name: str, *, give_up_after: float
) -> AsyncIterator[dict[str, Any]]:
    """Yield the FlowRun each time it changes, until it is terminal or waiting or time is up."""
    deadline = time.monotonic() + give_up_after
    run = await get_run(api, namespace, name)
    yield run
    while time.monotonic() < deadline:
        if _settled(run):
            return
        remaining = max(1, int(deadline - time.monotonic()))
        try:
            async for event in api.watch(
                run_path(namespace),
                fieldSelector=f"metadata.name={name}",
                resource_version=run["metadata"]["resourceVersion"],
                timeout_seconds=min(remaining, 60),
            ):
                if event.get("type") in ("ADDED", "MODIFIED"):
                    run = event["object"]
                    yield run
                    if _settled(run):
                        return
                elif event.get("type") == "ERROR":
                    break
        except kube.ApiError as exc:
            if not exc.retryable and exc.status != 410:
                raise
        run = await get_run(api, namespace, name)
        yield run


def node_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Lines describing node phase changes between two FlowRuns."""
    old, new = flowrun_api.status_of(before), flowrun_api.status_of(after)
    lines = []
    for key, record in new.nodes.items():
        seen = old.nodes.get(key)
        if seen is None or seen.phase is not record.phase:
            lines.append(f"  {record.phase.value:<9} {key}")
    if new.phase is not None and new.phase is not old.phase:
        lines.append(f"run {after['metadata']['name']} {new.phase.value}")
    return lines


async def logs(api: kube.Client, namespace: str, name: str, attempt: int | None) -> str:
    """The runner's log for an attempt (default: the current one)."""
    if attempt is None:
        run = await get_run(api, namespace, name)
        attempt = flowrun_api.status_of(run).attempt or 1
    pod = f"{name}-{attempt}"
    path = kube.path_of("pods", namespace, pod, sub="log")
    text: str = await api.request_text("GET", path)
    return text


def exit_code(phase: str | None) -> int:
    """Exit code for a phase: 0 Succeeded, 1 Failed/Cancelled, 3 Waiting, 4 still running."""
    if phase == flowrun_api.RunPhase.SUCCEEDED:
        return 0
    if phase == flowrun_api.RunPhase.WAITING:
        return 3
    if phase in flowrun_api.TERMINAL_PHASES:
        return 1
    return 4


def run_async(coro: Any) -> Any:
    """Run a coroutine; Ctrl-C exits quietly."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        sys.exit(130)
