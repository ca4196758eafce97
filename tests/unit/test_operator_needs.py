"""An operator run by hand works, and what it cannot get is said once and on /readyz (item 18).

Leader election is off unless asked for (as controller-runtime scaffolds do); the chart and
config/manager turn it on. With it on and the Lease's namespace missing, the elector used to
log a WARNING every 2 s forever; now it says once, as an error, what to do, and ``/readyz``
answers 503 with the same line until the namespace appears. The API server is a scripted
loopback HTTP server that counts the elector's requests, so "once" is proven over several
attempts without waiting on a clock.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentflows.controller import metrics
from agentflows.controller.runtime import leader
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from devcluster.ports import free_port

REPO = Path(__file__).resolve().parents[2]


class LeaseServer:
    """Leases in ``namespace`` only: any other namespace answers 404 as the API server does."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.creates = 0
        self.attempted = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_route("*", "/apis/coordination.k8s.io/v1/{rest:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        namespace = request.path.split("/namespaces/", 1)[1].split("/", 1)[0]
        if namespace != self.namespace:
            if request.method == "POST":
                self.creates += 1
                if self.creates >= 3:
                    self.attempted.set()
            return web.json_response(
                {
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "NotFound",
                    "message": f'namespaces "{namespace}" not found',
                    "code": 404,
                },
                status=404,
            )
        if request.method == "GET":
            return web.json_response({"kind": "Status", "reason": "NotFound"}, status=404)
        body: dict[str, Any] = await request.json()
        body["metadata"]["resourceVersion"] = "1"
        return web.json_response(body, status=201)


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_a_missing_lease_namespace_is_one_error_saying_what_to_do_and_shown_on_readyz(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = LeaseServer("agentflows-system")
    server = TestServer(fake.app)
    await server.start_server()
    api = kube.Client(kubeconfig.Config(server=str(server.make_url(""))), retry_seconds=0)
    found = metrics.Metrics()
    port = free_port()
    found.serve(port)
    election = leader.LeaderElection(
        namespace="no-such-namespace",
        lease_name="agentflows-operator",
        identity="me",
        retry_seconds=0.01,
    )
    elector = leader.Elector(api, election, needs=found.unmet)
    caplog.set_level(logging.INFO)
    acquiring = asyncio.create_task(elector.acquire())
    try:
        await asyncio.wait_for(fake.attempted.wait(), 30)
        status, body = await asyncio.to_thread(_readyz, port)
        assert status == 503
        assert "not ready: leader election: the Lease's namespace no-such-namespace does not" in (
            body
        )
        assert "kubectl create namespace no-such-namespace" in body
        assert "--leader-elect=false" in body
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        assert errors[0].levelno == logging.ERROR
        assert "does not exist" in errors[0].getMessage()

        fake.namespace = "no-such-namespace"  # someone created it
        await asyncio.wait_for(acquiring, 30)
        assert elector.leading
        assert found.unmet.messages() == []
        assert (await asyncio.to_thread(_readyz, port)) == (200, "ok\n")
    finally:
        acquiring.cancel()
        await api.close()
        await server.close()


def test_the_shipped_deployments_turn_leader_election_on_explicitly() -> None:
    manager = next(
        doc
        for doc in yaml.safe_load_all((REPO / "config/manager/manager.yaml").read_text())
        if doc and doc.get("kind") == "Deployment"
    )
    [container] = manager["spec"]["template"]["spec"]["containers"]
    assert "--leader-elect=true" in container["command"]
    chart = (REPO / "charts/agentflows/templates/operator-deployment.yaml").read_text()
    assert "- --leader-elect=true" in chart
