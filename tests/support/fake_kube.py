"""A fake Kubernetes API on a loopback HTTP server, for the webhook receiver's unit tests.

Serves Flows (list, and a watch that stays open without events), Secrets by name and FlowRun
creates, and records every request so a test can count what the receiver asked the API server.
Behaviour against the real API server is tested in tests/cluster/test_triggers.py.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from aiohttp import web

from agentflows.kube import client as kube
from agentflows.kube import kubeconfig


class FakeKubeApi:
    """Flows and Secrets of one namespace; FlowRuns created are kept in ``created``."""

    def __init__(self, namespace: str = "team") -> None:
        self.namespace = namespace
        self.flows: list[dict[str, Any]] = []
        self.secrets: dict[str, dict[str, bytes]] = {}
        self.created: list[dict[str, Any]] = []
        #: (method, path, query) of every request.
        self.requests: list[tuple[str, str, str]] = []
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    async def client(self) -> kube.Client:
        """A kube.Client whose requests this fake answers (its server starts here)."""
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return kube.Client(kubeconfig.Config(server=f"http://127.0.0.1:{port}"), retry_seconds=0)

    async def close(self) -> None:
        """Stop the server."""
        self._closing.set()  # ends the open watches, so the server stops at once
        if self._runner is not None:
            await self._runner.cleanup()

    def gets(self, resource: str) -> int:
        """How many GETs of one resource (``flows``, ``secrets``) were made, watches excluded."""
        return sum(
            1
            for method, path, query in self.requests
            if method == "GET" and f"/{resource}" in path and "watch=true" not in query
        )

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests.append((request.method, path, request.query_string))
        if request.method == "GET" and path.endswith("/flows"):
            if request.query.get("watch") == "true":
                response = web.StreamResponse()
                await response.prepare(request)
                await self._closing.wait()  # open until the fake stops
                return response
            listing = {"items": self.flows, "metadata": {"resourceVersion": "1"}}
            return web.json_response(listing)
        if request.method == "GET" and "/secrets/" in path:
            data = self.secrets.get(path.rsplit("/", 1)[1])
            if data is not None:
                encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
                return web.json_response({"data": encoded})
        if request.method == "POST" and path.endswith("/flowruns"):
            body = await request.json()
            body["metadata"]["name"] = f"{body['spec']['flow']}-{len(self.created)}"
            self.created.append(body)
            return web.json_response(body, status=201)
        return web.json_response({"reason": "NotFound", "message": path}, status=404)
