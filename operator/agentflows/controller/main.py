"""``agentflows operator``: the cache's watches and the work queue in one event loop.

Called by the ``operator`` command in :mod:`agentflows.cli.main`. Builds the API client
(kubeconfig context or in-cluster account), the metrics server (``/metrics``, ``/healthz``,
``/readyz``) and the :class:`~agentflows.controller.context.Controller` with its cache, the
operator's one :class:`~agentflows.triggers.kubernetes.WatchManager` and its MCP tool discovery.
The watches start at once; the work queue starts once the cache holds its first lists (so no
reconcile decides from a partial view), and everything stops on SIGINT/SIGTERM. Trigger
CronJobs use ``$AGENTFLOWS_TRIGGER_IMAGE``, else the runner image
(:meth:`agentflows.triggers.schedule.Settings.from_env`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Mapping
from typing import Any

from agentflows import tracing
from agentflows.api import API_VERSION
from agentflows.controller import (
    agents,
    budgets,
    cache,
    context,
    events,
    finishing,
    flowruns,
    flows,
    flowtriggers,
    retention,
    settings,
    snapshots,
    stalled,
    tooldiscovery,
)
from agentflows.controller import metrics as metrics_mod
from agentflows.controller.runtime import leader, workqueue
from agentflows.kube import client as kube
from agentflows.triggers import kubernetes, schedule

log = logging.getLogger(__name__)


def dispatch(ctl: context.Controller) -> workqueue.Reconciler:
    """The reconcile function of the work queue: by key kind."""
    reconcilers = {
        workqueue.AGENT: agents.reconcile,
        workqueue.FLOW: flows.reconcile,
        workqueue.FLOWRUN: flowruns.reconcile,
        workqueue.HISTORY: finishing.enforce_history,
        workqueue.SUMMARY: flows.summarize,
        workqueue.BUDGET: budgets.reconcile,
        workqueue.SESSIONS: retention.reconcile,
    }

    async def reconcile(key: workqueue.Key) -> float | None:
        ctl.metrics.reconciles.labels(key.kind).inc()
        again = await reconcilers[key.kind](ctl, key)
        await stalled.clear(ctl, key)
        return again

    return reconcile


def quiet_libraries() -> None:
    """Keep per-request lines of httpx out of the operator's log."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _trigger_suspended(
    ctl: context.Controller, reason: str = "TriggerSuspended"
) -> kubernetes.Suspended:
    """A Warning Event on the Flow: a trigger was suspended, or refused a loop (TriggerLoop).

    The Flow is reconciled too, so its ``TriggersRefused`` condition says the same.
    """

    async def post(flow: Mapping[str, Any], trigger: str, message: str) -> None:
        text = f"trigger {trigger}: {message}"
        # a listed object carries no kind: the Event names it fully
        involved = {**flow, "apiVersion": API_VERSION, "kind": "Flow"}
        await events.post(ctl.api, involved, events.WARNING, reason, text)
        meta = flow["metadata"]
        ctl.enqueue(workqueue.FLOW, meta["namespace"], meta["name"])

    return post


async def run(
    config: settings.OperatorConfig,
    kubeconfig: str | None = None,
    kube_context: str | None = None,
) -> None:
    """Run the operator until stopped, with kubectl's credentials or in-cluster ones."""
    quiet_libraries()
    tracing.configure("agentflows-operator")
    api = kube.Client.from_env(kubeconfig, kube_context)
    metrics = metrics_mod.Metrics()
    api.on_response = metrics.api_answered
    ctl = context.Controller(api=api, config=config, metrics=metrics)
    ctl.queue = workqueue.WorkQueue(
        dispatch(ctl),
        workers=config.workers,
        on_error=lambda key, _exc: metrics.reconcile_errors.labels(key.kind).inc(),
        on_terminal=stalled.record(ctl),
        on_timing=metrics.queue_timing,
    )
    ctl.cache = cache.Cache(api, config.namespaces, config.owns, ctl.enqueue)
    ctl.snapshots = snapshots.Snapshots(ctl.cache)
    ctl.triggers = flowtriggers.FlowTriggers(
        kubernetes.WatchManager(
            api,
            on_suspended=_trigger_suspended(ctl),
            lineage=flowtriggers.run_lineage(ctl.cache),
            on_loop=_trigger_suspended(ctl, "TriggerLoop"),
        ),
        schedule.Settings.from_env(),
    )
    metrics.watch_triggers(ctl.triggers.manager.watches)
    metrics.watch_queue(ctl.queue.pending)
    ctl.tools = tooldiscovery.ToolDiscovery(
        lambda namespace, name: ctl.enqueue(workqueue.AGENT, namespace, name),
        retry_seconds=config.not_ready_recheck_seconds,
    )
    if config.metrics_port:
        metrics.serve(config.metrics_port, ready=ctl.cache.synced.is_set)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("agentflows operator starting: %s", dataclasses.asdict(config))
    tasks = [asyncio.create_task(ctl.cache.run(), name="cache")]
    try:
        if await _until(stop, ctl.cache.synced, tasks):
            # leader election: the queue (every reconcile and write) runs only while this
            # replica leads; a standby keeps its cache warm
            work = leader.run_leading(
                config.leader_election,
                api,
                ctl.queue.run,
                leading=lambda on: metrics.leader.set(int(on)),
                needs=metrics.unmet,
            )
            tasks.append(asyncio.create_task(work, name="queue"))
            log.info("agentflows operator reconciling")
            await _until(stop, None, tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ctl.triggers.close()
        await ctl.tools.close()
        await api.close()
        tracing.shutdown()


async def _until(
    stop: asyncio.Event, event: asyncio.Event | None, tasks: list[asyncio.Task[None]]
) -> bool:
    """Wait for ``event`` (True), a stop signal (False) or a task's end (its error is raised)."""
    waiters = {asyncio.create_task(stop.wait())}
    if event is not None:
        waiters.add(asyncio.create_task(event.wait()))
    try:
        done, _ = await asyncio.wait({*waiters, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    for task in tasks:
        if task in done:
            task.result()
            raise RuntimeError(f"{task.get_name()} stopped")
    return event is not None and event.is_set() and not stop.is_set()
