"""The console's web application: routes, static files, security, and serving it.

:func:`cluster_app` serves a cluster's runs, flows and requests, acting as each caller
(:mod:`.identity`); :func:`local_app` serves the runs of a local state directory. Both answer
with the security headers of :mod:`.security` and check the CSRF token and origin of every
POST. Static files (one script, one stylesheet) come from this package: nothing is loaded from
anywhere else, so the console works without internet access.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from agentflows.api import common
from agentflows.console import (
    identity,
    live,
    local_pages,
    pages_flows,
    pages_requests,
    pages_runs,
    security,
    site,
)

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"


async def _home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/runs")


async def _healthz(request: web.Request) -> web.StreamResponse:
    """The probes' answer: serving (no identity needed, nothing about the cluster said)."""
    return web.Response(text="ok")


def _base(
    console: site.Console, name_problem: site.NameCheck, *, loopback: bool
) -> web.Application:
    """The application both consoles share; ``loopback``: it acts as the user running it."""
    guards = [security.loopback_only] if loopback else []
    middlewares = [*guards, site.names_only(name_problem), security.origin_middleware]
    app = web.Application(middlewares=[*middlewares, site.api_errors])
    app[site.KEY] = console
    app.on_response_prepare.append(security.add_headers)
    app.router.add_get("/", _home)
    app.router.add_get("/healthz", _healthz)
    app.router.add_static("/static", STATIC, append_version=False)
    return app


def cluster_app(
    gate: identity.Gate,
    namespace: str,
    *,
    webhook_url: str = "",
    namespaces: tuple[str, ...] = (),
) -> web.Application:
    """The console of a cluster, acting as each caller through ``gate``.

    ``webhook_url``: the webhook receiver's address, to show webhook triggers' URLs under;
    ``namespaces``: where to look for the runs of a user who may not list them cluster-wide.
    """
    hub = live.Hub(gate)
    console = site.Console(
        csrf=security.Csrf(),
        namespace=namespace,
        gate=gate,
        hub=hub,
        webhook_url=webhook_url,
        namespaces=namespaces,
    )
    app = _base(console, common.name_problem, loopback=gate.local)
    routes = app.router
    routes.add_get("/runs", pages_runs.runs_page)
    routes.add_get("/runs/{namespace}/{name}", pages_runs.run_page)
    routes.add_post("/runs/{namespace}/{name}/cancel", pages_runs.cancel)
    routes.add_post("/runs/{namespace}/{name}/rerun", pages_runs.rerun)
    routes.add_get("/runs/{namespace}/{name}/nodes/{node}/output", pages_runs.node_output)
    routes.add_get("/runs/{namespace}/{name}/graph.svg", pages_runs.graph_svg)
    routes.add_get("/events/runs", pages_runs.runs_events)
    routes.add_get("/events/run/{namespace}/{name}", pages_runs.run_events)
    routes.add_get("/events/run/{namespace}/{name}/text", pages_runs.run_text_events)
    routes.add_get("/requests", pages_requests.inbox)
    routes.add_post("/requests/{namespace}/{name}/{rid}", pages_requests.decide)
    routes.add_get("/flows", pages_flows.flows_page)
    routes.add_post("/flows/{namespace}/{name}/start", pages_flows.start)

    async def stop(_: web.Application) -> None:
        await hub.close()
        await gate.api.close()

    app.on_shutdown.append(stop)
    return app


def local_app(runs: local_pages.LocalRuns) -> web.Application:
    """The console of a local state directory."""
    app = _base(site.Console(csrf=security.Csrf(), namespace=""), runs.name_problem, loopback=True)
    app[local_pages.KEY] = runs
    watches = app[local_pages.WATCHES] = local_pages.Watches(runs)
    routes = app.router
    routes.add_get("/runs", local_pages.runs_page)
    routes.add_get("/requests", local_pages.requests_page)
    routes.add_get("/flows", local_pages.flows_page)
    routes.add_get("/local/{name}", local_pages.run_page)
    routes.add_get("/local/{name}/graph.svg", local_pages.graph_svg)
    routes.add_get("/events/local/{name}", local_pages.run_events)
    routes.add_post("/local/{name}/resume", local_pages.resume)
    routes.add_post("/local/{name}/requests/{rid}", local_pages.decide)

    async def stop(_: web.Application) -> None:
        await watches.close()

    app.on_shutdown.append(stop)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("console on http://%s:%d", host if ":" not in host else f"[{host}]", port)
        await stop.wait()
    finally:
        await runner.cleanup()
