"""A reconcile error that retrying cannot fix: the operator says so in a Warning Event, once.

The work queue (tests/unit/test_workqueue.py) stops retrying such an error; here its hook in the
operator posts ``ReconcileFailed`` on the object to a loopback API server that records it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from agentflows.controller import cache, context, main, settings, workqueue
from agentflows.controller import metrics as metrics_mod
from agentflows.engine import errors
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig


async def test_a_reconcile_error_retrying_cannot_fix_is_posted_once_as_a_warning_event() -> None:
    posted: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        if request.method == "POST" and request.path == "/api/v1/namespaces/team/events":
            posted.append(await request.json())
            return web.json_response(posted[-1], status=201)
        return web.json_response({"reason": "NotFound", "message": request.path}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server = f"http://127.0.0.1:{runner.addresses[0][1]}"
    calls: list[workqueue.Key] = []
    key = workqueue.Key(workqueue.FLOWRUN, "team", "etl-1")
    async with kube.Client(kubeconfig.Config(server=server), retry_seconds=0) as api:
        config = settings.OperatorConfig(namespaces=("team",), metrics_port=None)
        ctl = context.Controller(api=api, config=config, metrics=metrics_mod.Metrics())
        ctl.cache = cache.Cache(api, config.namespaces, config.owns, ctl.enqueue)

        async def reconcile(key: workqueue.Key) -> float | None:
            calls.append(key)
            raise errors.PermanentError("ConfigMap team/etl-1-out-0 is gone")

        queue = workqueue.WorkQueue(reconcile, workers=1, on_terminal=main.terminal_event(ctl))
        ctl.queue = queue
        queue.add(key)
        worker = asyncio.create_task(queue.run())
        for _ in range(1000):
            if posted and not queue.pending():
                break
            await asyncio.sleep(0.01)
        worker.cancel()
        assert queue.due(key) is None
    await runner.cleanup()

    assert calls == [key]
    (event,) = posted
    assert (event["type"], event["reason"]) == ("Warning", "ReconcileFailed")
    assert event["involvedObject"]["kind"] == "FlowRun"
    assert event["involvedObject"]["name"] == "etl-1"
    assert event["message"].startswith("ConfigMap team/etl-1-out-0 is gone; the operator does not")
    assert "until the FlowRun or what it refers to changes" in event["message"]
