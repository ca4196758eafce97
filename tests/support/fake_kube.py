"""A fake Kubernetes API behind an httpx transport, for the webhook receiver's unit tests.

Serves Flows (list, and a watch that stays open without events), Secrets by name and FlowRun
creates, and records every request so a test can count what the receiver asked the API server.
Behaviour against the real API server is tested in tests/cluster/test_triggers.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentflows.kube import client as kube
from agentflows.kube import kubeconfig


class _OpenWatch(httpx.AsyncByteStream):
    """A watch response that sends nothing and ends only when the client closes it."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""  # pragma: no cover - never reached


class FakeKubeApi:
    """Flows and Secrets of one namespace; FlowRuns created are kept in ``created``."""

    def __init__(self, namespace: str = "team") -> None:
        self.namespace = namespace
        self.flows: list[dict[str, Any]] = []
        self.secrets: dict[str, dict[str, bytes]] = {}
        self.created: list[dict[str, Any]] = []
        #: (method, path, query) of every request.
        self.requests: list[tuple[str, str, str]] = []

    def client(self) -> kube.Client:
        """A kube.Client whose requests this fake answers."""
        api = kube.Client(kubeconfig.Config(server="http://api"), retry_seconds=0)
        api._http = httpx.AsyncClient(base_url="http://api", transport=httpx.MockTransport(self))
        return api

    def gets(self, resource: str) -> int:
        """How many GETs of one resource (``flows``, ``secrets``) were made, watches excluded."""
        return sum(
            1
            for method, path, query in self.requests
            if method == "GET" and f"/{resource}" in path and "watch=true" not in query
        )

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.requests.append((request.method, path, request.url.query.decode()))
        if request.method == "GET" and path.endswith("/flows"):
            if request.url.params.get("watch") == "true":
                return httpx.Response(200, stream=_OpenWatch())
            listing = {"items": self.flows, "metadata": {"resourceVersion": "1"}}
            return httpx.Response(200, json=listing)
        if request.method == "GET" and "/secrets/" in path:
            data = self.secrets.get(path.rsplit("/", 1)[1])
            if data is not None:
                encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
                return httpx.Response(200, json={"data": encoded})
        if request.method == "POST" and path.endswith("/flowruns"):
            body = json.loads(request.content)
            body["metadata"]["name"] = f"{body['spec']['flow']}-{len(self.created)}"
            self.created.append(body)
            return httpx.Response(201, json=body)
        return httpx.Response(404, json={"reason": "NotFound", "message": path})
