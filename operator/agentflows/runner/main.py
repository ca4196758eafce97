"""``agentflows runner``: one attempt of a FlowRun, inside its pod.

Called by the ``runner`` command of :mod:`agentflows.cli.main` (the pod's command). One attempt:

1. read the FlowRun, and the snapshot ``<run>-snapshot`` written by the operator from the pod's
   volume of the run's ConfigMaps (:mod:`agentflows.kube.mounted`: the runner's identity may not
   read ConfigMaps), checked against ``status.snapshotDigest``; the attempt this pod belongs to
   is ``$AGENTFLOWS_ATTEMPT`` (set by the operator in the pod; else the FlowRun's
   ``status.attempt``);
2. compile the snapshot's Flow; a bad Flow or snapshot ends the run: result Failed, reason
   FlowInvalid (or SnapshotMissing), exit 1;
3. run the engine with the FlowRun-status store and the live capabilities (secrets come from
   the files of the pod's secrets volume, read once here: :func:`agentflows.agents.secrets.mounted`;
   none is in the container's environment);
4. the store writes ``status.result`` with the outcome, without reading the FlowRun again;
   exit 0 (Succeeded), 1 (Failed) or 3 (Waiting).

A one-node run against a FlowRun the operator prepared costs three API requests: the read of
the FlowRun, the node's final record and the outcome (its Running record waits, see
:mod:`agentflows.kube.status_store`, and is never sent for a node that ends within a second).

SIGTERM (pod deletion, cancel) cancels the run: nodes in flight stay Running in the status (the
records still waiting are written first) and the next attempt runs them again; no result is
written and the exit status is 143. A permanent error
(:class:`agentflows.api.errors.PermanentError`: e.g. an offloaded output whose ConfigMap is
gone) ends the run, since another pod would meet it again: result Failed, reason StateLost,
exit 1. Any other error (the API server away for longer than the client's retries, a
bug) exits 2 with no result, which the operator treats as a lost attempt to retry.

Traces: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (the operator passes its own on), the attempt is
a ``run`` span in the run's one trace, child of the run's own span (:mod:`agentflows.tracing`),
exported before the process exits.

Progress: one line per node on stdout (never a secret value: errors from the agents layer are
redacted there), and ``status.currentNode``, which waits with the Running records: it is
written with the next status write, or after :data:`agentflows.kube.status_store.RUNNING_DELAY`
if the node still runs, so quick nodes cost nothing for it. The answers of agent and llm nodes
go to stdout too as the model writes them, redacted, each piece a JSON line framed apart from
the progress lines (:mod:`agentflows.runner.stream_log`); never into the FlowRun's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import pydantic

from agentflows import tracing
from agentflows.api import budget as budget_api
from agentflows.api import errors, times, wellknown
from agentflows.api import flowrun as flowrun_api
from agentflows.api import snapshot as snapshot_api
from agentflows.engine import graph, state, store
from agentflows.engine import run as run_mod
from agentflows.kube import client as kube_client
from agentflows.kube import mounted, session_store, status_store
from agentflows.kube import snapshot as snapshot_mod
from agentflows.runner import stream_log

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

#: The variable in which the operator tells the pod its attempt (controller/pods.py sets it).
ATTEMPT_ENV = "AGENTFLOWS_ATTEMPT"

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

    def __call__(self, event: state.RunEvent) -> None:
        """Take one engine event (the engine calls observers synchronously)."""
        if event.kind == "started":
            self._started[event.key] = time.monotonic()
            self.checkpoints.save_current_node(event.key)
            return
        if event.kind not in _FINISHED_EVENTS:
            return
        line = f"node {event.key} ({event.node_kind}) {event.kind}"
        if event.key in self._started:
            line += f" in {time.monotonic() - self._started.pop(event.key):.2f}s"
        if event.kind == "failed" and event.status is not None and event.status.error:
            line += ": " + event.status.error.splitlines()[0][:500]
        self.line(line)

    def line(self, text: str) -> None:
        """Print one progress line."""
        print(f"{times.timestamp()} {text}", file=self.out, flush=True)


async def _fail(
    checkpoints: status_store.StatusStore, reason: flowrun_api.RunReason, message: str
) -> int:
    outcome = store.Outcome(
        flowrun_api.RunPhase.FAILED,
        reason=reason,
        message=message,
        completed_at=times.timestamp(),
    )
    await checkpoints.save_outcome(outcome)
    print(f"{times.timestamp()} run Failed ({reason}): {message}", flush=True)
    return EXIT_FAILED


def _compile(snap: snapshot_api.Snapshot) -> tuple[graph.CompiledFlow, graph.StaticResolver]:
    """Compile the snapshot's Flow; raise FlowInvalid with a message that names the problem."""
    try:
        resolver = graph.StaticResolver.of_snapshot(snap)
    except pydantic.ValidationError as exc:
        raise _invalid(f"a spec in the snapshot is invalid: {exc}") from exc
    spec = resolver.flow(snap.flow)
    if spec is None:
        raise _invalid(f'no Flow "{snap.flow}" in the snapshot')
    return graph.compile_flow(spec, resolver), resolver


def _invalid(message: str) -> graph.FlowInvalid:
    """FlowInvalid with one problem of the snapshot."""
    from agentflows.api import documents  # loads YAML: not on a valid run's way to its model

    return graph.FlowInvalid([documents.Problem("snapshot", message)])


async def run_attempt(
    client: kube_client.Client,
    namespace: str,
    name: str,
    attempt: int | None = None,
    ceilings: tuple[state.Cap, ...] = (),
    configmaps: mounted.Mounted | None = None,
) -> int:
    """Run attempt ``attempt`` of FlowRun ``namespace/name`` and return the exit status.

    ``attempt`` is what the operator told the pod (None: the FlowRun's ``status.attempt``);
    ``ceilings`` what the namespace's Budgets allow the run (:func:`told_budget`);
    ``configmaps`` the pod's volume of the run's ConfigMaps (None: where the operator mounts it).
    The FlowRun is read once (the snapshot is a file of the pod's); the outcome is written
    without reading the FlowRun again.
    """
    flowrun = await client.get(kube_client.path_of("flowruns", namespace, name))
    spec = flowrun.get("spec") or {}
    if attempt is None:
        attempt = flowrun_api.status_of(flowrun).attempt
    configmaps = configmaps or mounted.Mounted.from_environ()
    checkpoints = status_store.StatusStore(
        client, namespace, name, attempt=attempt, flowrun=flowrun, configmaps=configmaps
    )
    print(f"{times.timestamp()} run {namespace}/{name} attempt {attempt}", flush=True)
    try:
        snap = snapshot_mod.read_mounted_snapshot(configmaps, flowrun)
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
    # litellm is heavy: only once there is a flow to run
    from agentflows.agents import host, secrets

    # Read before any tool starts; only this process holds the values from here on.
    env = {**os.environ, **secrets.mounted(secrets.root())}

    progress = Progress(checkpoints)
    metadata = flowrun.get("metadata") or {}
    traceparent = (metadata.get("annotations") or {}).get(wellknown.TRACEPARENT_ANNOTATION)
    try:
        with tracing.run_context(str(metadata.get("uid") or ""), traceparent):
            outcome = await run_mod.run_flow(
                compiled,
                run_name=name,
                input_value=spec.get("input"),
                store_=checkpoints,
                caps=host.LiveCapabilities(
                    resolver,
                    env=env,
                    session_store=session_store.SessionStore(client, namespace, confined=True),
                    file_access=_file_access(configmaps),
                    listener=stream_log.LogListener(),
                ),
                resolver=resolver,
                trigger=spec.get("trigger"),
                observer=progress,
                ceilings=ceilings,
            )
    except errors.PermanentError as exc:  # the stored state is unusable: no retry can help
        return await _fail(checkpoints, flowrun_api.RunReason.STATE_LOST, str(exc))
    except asyncio.CancelledError:
        await _flush_when_stopped(checkpoints)
        raise
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


def _file_access(configmaps: mounted.Mounted) -> Any:
    """Reference files in the pod: the run's ConfigMaps' keys, paths under the files root.

    The keys are those the operator mounted for the run's ``configMapKeyRef`` files
    (:mod:`agentflows.kube.mounted`); the root of paths is AGENTFLOWS_FILES_ROOT, else the
    default where runner.files volumes are mounted. A Flow can set neither (the operator's
    prefix); the development cluster's process kubelet does, to point at its copy of the mounts.
    """
    from agentflows.agents import files

    async def read(name: str, key: str) -> bytes:
        found = configmaps.read(name, key)
        if found is None:
            raise files.FileError(f"configmap {name} has no key {key!r}, or does not exist")
        return found

    root = os.environ.get(files.FILES_ROOT_ENV) or files.POD_FILES_ROOT
    return files.FileAccess(root=pathlib.Path(root), config_map=read)


async def _flush_when_stopped(checkpoints: status_store.StatusStore) -> None:
    """Write the Running records still waiting, so the nodes in flight show in the status."""
    try:
        await checkpoints.flush()
    except kube_client.ApiError as exc:
        log.warning("could not write the records of the nodes in flight: %s", exc)


def told_attempt(environ: Mapping[str, str]) -> int | None:
    """The attempt the operator gave the pod in :data:`ATTEMPT_ENV` (None: not given).

    Raises :class:`ValueError` with a one-line message when the value is not a whole number
    of at least 1.
    """
    value = environ.get(ATTEMPT_ENV)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ATTEMPT_ENV}={value!r}: expected a whole number of at least 1")
    return int(value)


def told_budget(environ: Mapping[str, str]) -> tuple[state.Cap, ...]:
    """The cap the operator gave the pod in ``$AGENTFLOWS_BUDGET`` (none: no Budget applies).

    Raises :class:`ValueError` with a one-line message when the value is not a RunBudget.
    """
    value = environ.get(budget_api.RUN_BUDGET_ENV)
    if not value:
        return ()
    try:
        told = budget_api.RunBudget.model_validate_json(value)
    except pydantic.ValidationError as exc:
        from agentflows.api import documents

        problems = "; ".join(str(p) for p in documents.validation_problems(exc, prefix=""))
        raise ValueError(f"{budget_api.RUN_BUDGET_ENV}: {problems}") from exc
    cap = state.Cap(
        told.max_tokens,
        told.max_cost_usd,
        f"Budget {told.tokens_by} ({told.max_tokens} tokens left for this run)",
        f"Budget {told.cost_by} (${told.max_cost_usd} left for this run)",
        reason=flowrun_api.RunReason.BUDGET_EXCEEDED,
    )
    return (cap,)


async def _main(
    namespace: str, name: str, told: int | None, ceilings: tuple[state.Cap, ...]
) -> int:
    loop = asyncio.get_running_loop()
    async with kube_client.Client.from_env() as client:
        attempt = asyncio.ensure_future(run_attempt(client, namespace, name, told, ceilings))
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
            print(f"{times.timestamp()} run stopped by SIGTERM", flush=True)
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
        told = told_attempt(os.environ)
        ceilings = told_budget(os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_LOST
    tracing.configure(
        "agentflows-runner",
        resource={"agentflows.run.name": flowrun, "agentflows.run.attempt": told or 0},
    )
    try:
        return asyncio.run(_main(namespace, flowrun, told, ceilings))
    except Exception:
        log.exception("attempt lost: unexpected error")
        return EXIT_LOST
    finally:
        tracing.shutdown()
