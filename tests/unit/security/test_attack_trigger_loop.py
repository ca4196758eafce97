"""A kubernetes trigger fed by its own runs' Events is refused, counted and told once.

Before the fix, a trigger on its own namespace's Events started a run for every Event about
its own runs (their phase changes), each of which made more: about a run a second from one
seed, and two such Flows fed each other without end. Here a loopback API server streams Events
about a run of the trigger's own Flow, about its runner pod, about runs of another Flow at
several trigger depths, and about unrelated objects; the lineage lookup is the operator's
answer from its cache (tested on the real cluster in tests/cluster/test_attack_trigger_loop.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from agentflows.api import wellknown
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from agentflows.triggers import kubernetes

#: What the operator's cache says the objects belong to: (Flow, trigger depth) of the run.
LINEAGE = {
    ("team-b", "FlowRun", "loop-1"): ("loop", 0),
    ("team-b", "Pod", "loop-1-1"): ("loop", 0),
    ("team-b", "FlowRun", "other-1"): ("other", kubernetes.MAX_TRIGGER_DEPTH),
    ("team-b", "FlowRun", "other-2"): ("other", 1),
}


def event_about(kind: str, name: str) -> dict[str, Any]:
    meta = {"name": f"{name}.{kind}", "namespace": "team-b", "uid": f"e-{kind}-{name}"}
    involved = {"kind": kind, "name": name, "namespace": "team-b", "uid": f"{kind}-{name}"}
    return {"type": "ADDED", "object": {"metadata": meta, "involvedObject": involved}}


class EventServer:
    """Events discovery, one list and one watch stream of ``events``; FlowRun creates."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.created: list[dict[str, Any]] = []
        self.sentinel = asyncio.Event()
        self.release = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/api/v1", self.discovery)
        self.app.router.add_get("/api/v1/namespaces/{ns}/events", self.watch)
        self.app.router.add_post("/apis/agentflows.io/v1alpha1/namespaces/{ns}/flowruns", self.run)

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"resources": [{"name": "events", "kind": "Event", "namespaced": True}]}
        )

    async def watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "1"}, "items": []})
        response = web.StreamResponse()
        await response.prepare(request)
        events, self.events = self.events, []
        for event in events:
            await response.write(json.dumps(event).encode() + b"\n")
        await self.release.wait()
        return response

    async def run(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["metadata"]["name"] = f"run-{len(self.created)}"
        self.created.append(body)
        if body["spec"]["trigger"]["payload"]["object"]["involvedObject"]["name"] == "sentinel":
            self.sentinel.set()
        return web.json_response(body, status=201)


async def test_a_trigger_never_fires_on_its_own_runs_and_a_chain_of_runs_stops_at_the_bound() -> (
    None
):
    events = [
        event_about("FlowRun", "loop-1"),
        event_about("Pod", "loop-1-1"),
        event_about("FlowRun", "other-1"),
        event_about("FlowRun", "other-2"),
        event_about("ConfigMap", "settings"),
        event_about("FlowRun", "loop-1"),
        event_about("ConfigMap", "sentinel"),
    ]
    told: list[tuple[str, str]] = []

    async def on_loop(flow: Any, trigger: str, message: str) -> None:
        told.append((trigger, message))

    fake = EventServer(events)
    server = TestServer(fake.app)
    await server.start_server()
    api = kube.Client(kubeconfig.Config(server=str(server.make_url(""))), retry_seconds=0)
    manager = kubernetes.WatchManager(
        api, lineage=lambda *about: LINEAGE.get(about), on_loop=on_loop
    )
    flow = {
        "metadata": {"name": "loop", "namespace": "team-b", "uid": "u", "generation": 1},
        "spec": {
            "nodes": [{"id": "a", "transform": "=1"}],
            "triggers": [{"name": "events", "kubernetes": {"apiVersion": "v1", "kind": "Event"}}],
        },
    }
    try:
        await manager.sync([flow])
        await asyncio.wait_for(fake.sentinel.wait(), 60)
    finally:
        fake.release.set()
        await manager.close()
        await api.close()
        await server.close()

    started = [
        (
            run["spec"]["trigger"]["payload"]["object"]["involvedObject"]["name"],
            run["metadata"]["annotations"][wellknown.DEPTH_ANNOTATION],
        )
        for run in fake.created
    ]
    assert started == [("other-2", "2"), ("settings", "0"), ("sentinel", "0")]
    assert manager.loops_refused == {"team-b/loop/events": 4}
    assert told == [
        ("events", "FlowRun loop-1 belongs to a run of this Flow: a trigger never fires on its "
         "own runs' objects (a loop)")
    ]  # fmt: skip
