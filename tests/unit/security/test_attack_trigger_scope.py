"""A kubernetes trigger sees only its Flow's namespace unless a wider scope was admitted.

A team-b Flow's trigger that names no namespace is handed objects of team-b only: the watch is
narrowed to team-b's path, and an object of team-a that reaches the operator anyway (the
loopback API server here streams every namespace's objects on every path) starts no run. The
wider scopes (another namespace, ``*``) are admitted only for a writer who may read them:
``config/policies/trigger-scope.yaml``, tested on a real API server in
tests/cluster/test_attack_trigger_scope.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from agentflows.api import flow as flow_api
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from agentflows.triggers import kubernetes
from tests.unit.security.test_attack_expressions import FakeApiServer


class SentinelApiServer(FakeApiServer):
    """Tells when the run of the object named ``sentinel`` is created (events come in order)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(events, [])
        self.sentinel = asyncio.Event()

    async def run(self, request: web.Request) -> web.Response:
        answer = await super().run(request)
        if self.created[-1]["spec"]["trigger"]["payload"]["object"]["metadata"]["name"] == (
            "sentinel"
        ):
            self.sentinel.set()
        return answer


def added(name: str, namespace: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}"}
    return {"type": "ADDED", "object": {"metadata": meta}}


def team_b_flow(scope: str | None) -> dict[str, Any]:
    source: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap"}
    if scope is not None:
        source["namespace"] = scope
    return {
        "metadata": {"name": "watcher", "namespace": "team-b", "uid": "u", "generation": 1},
        "spec": {
            "nodes": [{"id": "a", "transform": "=1"}],
            "triggers": [{"name": "cm", "kubernetes": source}],
        },
    }


async def started_by(flow: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The objects whose changes started runs of ``flow``, and the paths it watched."""
    events = [
        added("a-1", "team-a"),
        added("b-1", "team-b"),
        added("a-2", "team-a"),
        added("sentinel", "team-b"),
    ]
    fake = SentinelApiServer(events)
    server = TestServer(fake.app)
    await server.start_server()
    api = kube.Client(kubeconfig.Config(server=str(server.make_url(""))), retry_seconds=0)
    manager = kubernetes.WatchManager(api)
    try:
        await manager.sync([flow])
        await asyncio.wait_for(fake.sentinel.wait(), 60)
    finally:
        fake.release.set()
        await manager.close()
        await api.close()
        await server.close()
    objects = [
        "{namespace}/{name}".format(**run["spec"]["trigger"]["payload"]["object"]["metadata"])
        for run in fake.created
    ]
    return objects, fake.paths


async def test_a_trigger_without_a_namespace_sees_only_its_flows_namespace() -> None:
    objects, paths = await started_by(team_b_flow(None))
    assert objects == ["team-b/b-1", "team-b/sentinel"]
    assert set(paths) == {"/api/v1/namespaces/team-b/configmaps"}


async def test_a_trigger_admitted_for_every_namespace_sees_every_namespace() -> None:
    objects, paths = await started_by(team_b_flow(flow_api.ALL_NAMESPACES))
    assert objects == ["team-a/a-1", "team-b/b-1", "team-a/a-2", "team-b/sentinel"]
    assert set(paths) == {"/api/v1/configmaps"}
