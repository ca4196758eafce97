"""``agentflows operator``: run kopf's watches and our work queue in one event loop.

Called by the ``operator`` command in :mod:`agentflows.cli.main`. Builds the API client (the
same kubeconfig or in-cluster account kopf logs in with), the metrics server and the
:class:`~agentflows.controller.context.Controller` with the operator's one
:class:`~agentflows.triggers.kubernetes.WatchManager` and its MCP tool discovery, then runs
``kopf.operator`` next to the work queue until SIGINT/SIGTERM, and stops the watches and
discoveries on the way out. Trigger CronJobs use ``$AGENTFLOWS_TRIGGER_IMAGE``, else the
runner image (:meth:`agentflows.triggers.schedule.Settings.from_env`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Mapping
from typing import Any

import kopf

from agentflows.controller import (
    agents,
    context,
    events,
    finishing,
    flowruns,
    flows,
    flowtriggers,
    leader,
    settings,
    tooldiscovery,
    workqueue,
)
from agentflows.controller import handlers as _handlers  # noqa: F401  (registers kopf handlers)
from agentflows.controller import metrics as metrics_mod
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
    }

    async def reconcile(key: workqueue.Key) -> float | None:
        ctl.metrics.reconciles.labels(key.kind).inc()
        return await reconcilers[key.kind](ctl, key)

    return reconcile


def quiet_libraries() -> None:
    """Keep per-request and per-event lines of httpx and kopf out of the operator's log."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # kopf.objects logs "Handler ... succeeded" for every watch event at INFO.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def _trigger_suspended(api: kube.Client) -> kubernetes.Suspended:
    """Tell a Flow's author, with a Warning Event on the Flow, that a trigger was suspended."""

    async def post(flow: Mapping[str, Any], trigger: str, message: str) -> None:
        text = f"trigger {trigger}: {message}"
        # a listed object carries no kind: the Event names it fully
        involved = {**flow, "apiVersion": "agentflows.io/v1alpha1", "kind": "Flow"}
        await events.post(api, involved, events.WARNING, "TriggerSuspended", text)

    return post


async def run(
    config: settings.OperatorConfig,
    kubeconfig: str | None = None,
    kube_context: str | None = None,
) -> None:
    """Run the operator until stopped, with kubectl's credentials or in-cluster ones."""
    quiet_libraries()
    api = kube.Client.from_env(kubeconfig, kube_context)
    metrics = metrics_mod.Metrics()
    if config.metrics_port:
        metrics.serve(config.metrics_port)
    ctl = context.Controller(api=api, config=config, metrics=metrics)
    ctl.queue = workqueue.WorkQueue(
        dispatch(ctl),
        workers=config.workers,
        on_error=lambda key, _exc: metrics.reconcile_errors.labels(key.kind).inc(),
    )
    ctl.triggers = flowtriggers.FlowTriggers(
        kubernetes.WatchManager(api, on_suspended=_trigger_suspended(api)),
        schedule.Settings.from_env(),
    )
    metrics.watch_triggers(ctl.triggers.manager.watches)
    metrics.watch_queue(ctl.queue.pending)
    ctl.tools = tooldiscovery.ToolDiscovery(
        lambda namespace, name: ctl.enqueue(workqueue.AGENT, namespace, name),
        retry_seconds=config.not_ready_recheck_seconds,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    memo = kopf.Memo(controller=ctl)
    operator = asyncio.create_task(
        kopf.operator(
            settings=settings.kopf_settings(),
            standalone=True,
            clusterwide=config.clusterwide,
            namespaces=list(config.namespaces),
            memo=memo,
            stop_flag=stop,
        )
    )
    # leader election: the queue (every reconcile and write) runs only while this replica leads
    queue = asyncio.create_task(
        leader.run_leading(config.leader_election, api, metrics, ctl.queue.run)
    )
    log.info("agentflows operator started: %s", dataclasses.asdict(config))
    try:
        done, _ = await asyncio.wait({operator, queue}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            # kopf cancels the tasks started after it (our queue) when it stops: not an error.
            if not task.cancelled():
                task.result()
    finally:
        stop.set()
        queue.cancel()
        await asyncio.gather(operator, queue, return_exceptions=True)
        await ctl.triggers.close()
        await ctl.tools.close()
        await api.close()
