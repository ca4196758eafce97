"""``agentflows runner``: one attempt of a FlowRun, inside its pod.

Called by the ``runner`` command of :mod:`agentflows.cli.main` (the pod's command). One attempt:

1. read the FlowRun (``status.attempt`` is the attempt this pod belongs to) and the snapshot
   ConfigMap ``<run>-snapshot`` written by the operator;
2. compile the snapshot's Flow; a bad Flow or snapshot ends the run: result Failed, reason
   FlowInvalid (or SnapshotMissing), exit 1;
3. run the engine with the FlowRun-status store and the live capabilities (secrets come from
   the environment the operator built from ``secretKeyRef``s);
4. the store writes ``status.result`` with the outcome; exit 0 (Succeeded), 1 (Failed) or
   3 (Waiting).

SIGTERM (pod deletion, cancel) cancels the run: nodes in flight stay Running in the status and
the next attempt runs them again; no result is written and the exit status is 143. A permanent
error (:class:`agentflows.engine.errors.PermanentError`: e.g. an offloaded output whose
ConfigMap is gone) ends the run, since another pod would meet it again: result Failed, reason
StateLost, exit 1. Any other error (the API server away for longer than the client's retries, a
bug) exits 2 with no result, which the operator treats as a lost attempt to retry.

Progress: one line per node on stdout (never a secret value: errors from the agents layer are
redacted there), and ``status.currentNode``, written in the same patch as a node's Running
record, or — for nodes the engine does not record as Running (transform, branch) — only if the
node still runs after :data:`CURRENT_NODE_DELAY`, so progress costs at most one patch per node
start and nothing for quick nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from typing import TextIO

import pydantic

from agentflows.api import documents
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import clock, errors, graph, state, store
from agentflows.engine import run as run_mod
from agentflows.kube import client as kube_client
from agentflows.kube import snapshot as snapshot_mod
from agentflows.kube import status_store

log = logging.getLogger("agentflows.runner")

EXIT_SUCCEEDED = 0
#: The run failed permanently: the operator does not retry.
EXIT_FAILED = 1
#: No result was written: the operator counts a lost attempt and retries after the backoff.
EXIT_LOST = 2
#: Waiting for a human: the operator starts the next pod once the request is decided.
EXIT_WAITING = 3
#: Stopped by SIGTERM (128 + 15), as a shell reports it.
EXIT_TERMINATED = 143

#: Seconds a node that has no Running record must run before currentNode names it.
CURRENT_NODE_DELAY = 1.0

_EXIT_OF_PHASE = {
    flowrun_api.RunPhase.SUCCEEDED: EXIT_SUCCEEDED,
    flowrun_api.RunPhase.FAILED: EXIT_FAILED,
    flowrun_api.RunPhase.WAITING: EXIT_WAITING,
}
_FINISHED_EVENTS = ("succeeded", "failed", "waiting", "skipped")


class Progress:
    """The run's observer: a line per finished node, and ``status.currentNode``."""

    def __init__(self, checkpoints: status_store.StatusStore, out: TextIO = sys.stdout) -> None:
        self.checkpoints = checkpoints
        self.out = out
        self._started: dict[str, float] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}

    def __call__(self, event: state.RunEvent) -> None:
        """Take one engine event (the engine calls observers synchronously)."""
        if event.kind == "started":
            self._started[event.key] = time.monotonic()
            if self.checkpoints.current_node != event.key and event.key not in self._pending:
                self._pending[event.key] = asyncio.create_task(self._report(event.key))
            return
        if event.kind not in _FINISHED_EVENTS:
            return
        pending = self._pending.pop(event.key, None)
        if pending is not None:
            pending.cancel()
        line = f"node {event.key} ({event.node_kind}) {event.kind}"
        if event.key in self._started:
            line += f" in {time.monotonic() - self._started.pop(event.key):.2f}s"
        if event.kind == "failed" and event.status is not None and event.status.error:
            line += ": " + event.status.error.splitlines()[0][:500]
        self.line(line)

    def line(self, text: str) -> None:
        """Print one progress line."""
        print(f"{clock.timestamp()} {text}", file=self.out, flush=True)

    async def _report(self, key: str) -> None:
        try:
            await asyncio.sleep(CURRENT_NODE_DELAY)
            if self._pending.pop(key, None) is not None:
                await self.checkpoints.save_current_node(key)
        except kube_client.ApiError as exc:
            log.warning("could not write currentNode=%s: %s", key, exc)

    async def close(self) -> None:
        """Cancel progress writes still waiting."""
        tasks = list(self._pending.values())
        self._pending.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _fail(
    checkpoints: status_store.StatusStore, reason: flowrun_api.RunReason, message: str
) -> int:
    outcome = store.Outcome(
        flowrun_api.RunPhase.FAILED,
        reason=reason,
        message=message,
        completed_at=clock.timestamp(),
    )
    await checkpoints.save_outcome(outcome)
    print(f"{clock.timestamp()} run Failed ({reason}): {message}", flush=True)
    return EXIT_FAILED


def _compile(snap: snapshot_mod.RunSnapshot) -> tuple[graph.CompiledFlow, graph.StaticResolver]:
    """Compile the snapshot's Flow; raise FlowInvalid with a message that names the problem."""
    try:
        resolver = snap.resolver()
    except pydantic.ValidationError as exc:
        raise graph.FlowInvalid(
            [documents.Problem("snapshot", f"a spec in the snapshot is invalid: {exc}")]
        ) from exc
    spec = resolver.flow(snap.flow)
    if spec is None:
        raise graph.FlowInvalid(
            [documents.Problem("snapshot", f'no Flow "{snap.flow}" in the snapshot')]
        )
    return graph.compile_flow(spec, resolver), resolver


async def run_attempt(client: kube_client.Client, namespace: str, name: str) -> int:
    """Run one attempt of FlowRun ``namespace/name`` and return the exit status."""
    checkpoints = status_store.StatusStore(client, namespace, name)
    flowrun = await checkpoints.flowrun()
    spec = flowrun.get("spec") or {}
    attempt = (flowrun.get("status") or {}).get("attempt", 0)
    print(f"{clock.timestamp()} run {namespace}/{name} attempt {attempt}", flush=True)
    try:
        snap = await snapshot_mod.read_snapshot(client, namespace, name)
    except snapshot_mod.SnapshotError as exc:
        return await _fail(checkpoints, flowrun_api.RunReason.SNAPSHOT_MISSING, str(exc))
    try:
        compiled, resolver = _compile(snap)
    except graph.FlowInvalid as exc:
        return await _fail(
            checkpoints,
            flowrun_api.RunReason.FLOW_INVALID,
            f'Flow "{snap.flow}" is invalid: {exc}',
        )
    from agentflows.agents import host  # litellm is heavy: only once there is a flow to run

    progress = Progress(checkpoints)
    try:
        outcome = await run_mod.run_flow(
            compiled,
            run_name=name,
            input_value=spec.get("input"),
            store_=checkpoints,
            caps=host.LiveCapabilities(resolver),
            resolver=resolver,
            trigger=spec.get("trigger"),
            observer=progress,
        )
    except errors.PermanentError as exc:  # the stored state is unusable: no retry can help
        return await _fail(checkpoints, flowrun_api.RunReason.STATE_LOST, str(exc))
    finally:
        await progress.close()
    if not checkpoints.outcome_saved:
        # a run that had already ended: record the result for this attempt too
        await checkpoints.save_outcome(outcome)
    text = f"run {outcome.phase.value}"
    if outcome.reason and outcome.reason != outcome.phase.value:
        text += f" ({outcome.reason})"
    if outcome.message and outcome.phase != flowrun_api.RunPhase.SUCCEEDED:
        text += f": {outcome.message}"
    progress.line(text)
    return _EXIT_OF_PHASE.get(outcome.phase, EXIT_FAILED)


async def _main(namespace: str, name: str) -> int:
    loop = asyncio.get_running_loop()
    async with kube_client.Client.from_env() as client:
        attempt = asyncio.ensure_future(run_attempt(client, namespace, name))
        terminated = False

        def terminate() -> None:
            nonlocal terminated
            terminated = True
            attempt.cancel()

        loop.add_signal_handler(signal.SIGTERM, terminate)
        try:
            return await attempt
        except asyncio.CancelledError:
            if not terminated:
                raise
            print(f"{clock.timestamp()} run stopped by SIGTERM", flush=True)
            return EXIT_TERMINATED
        except kube_client.ApiError as exc:
            log.error("attempt lost: %s", exc)
            return EXIT_LOST
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)


def main(namespace: str, flowrun: str) -> int:
    """Run one attempt and return the process exit status (see the module docstring)."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the nodes
    try:
        return asyncio.run(_main(namespace, flowrun))
    except Exception:
        log.exception("attempt lost: unexpected error")
        return EXIT_LOST
