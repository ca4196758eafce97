"""The watch layer, kopf 1.45 against ours: CPU per watch event and start-up with N indexed objects.

```
python bench/kopf_watch.py           # 1k/2k/4k/10k held FlowRuns, 300 runs' events: 3-5 min
python bench/kopf_watch.py --quick   # 200 held, 20 runs' events: under a minute (smoke test)
```

Needs kopf (the ``bench`` extra: ``pip install -c constraints.txt -e '.[dev,bench]'``); the
operator itself does not depend on it. Nothing leaves loopback: a fake API server in a process of
its own (``--serve``) answers discovery, paged lists and watches of Agents, Flows, FlowRuns,
Budgets and pods on 127.0.0.1, from objects built before it listens (their JSON encoded once).

Each side runs in a fresh process, one at a time, against a fresh server:

- **kopf**: ``kopf.operator`` (standalone, cluster-wide, CRD scanning and Event posting off,
  ``settings.watching.chunk_size`` 500) with the handlers a kopf user would write for our cache:
  ``@kopf.index`` of FlowRuns by name (the compact run the operator keeps, converted by the same
  function ``controller/cache.py`` uses) and by Flow, of runner pods by name, of Agents, Flows
  and Budgets by name, and ``async`` ``@kopf.on.event`` handlers on FlowRuns and runner pods
  that add the run's key to our work queue.
- **ours**: ``controller.cache.Cache`` (``kube/informer.py``: pages of 500, one watch per kind)
  feeding the same ``WorkQueue``.

On both sides the work queue's reconcile does nothing but count, so what differs is only the
watch layer: reading the stream, decoding JSON, the framework's per-event work, the cache or
indexes, the enqueue. Measured in the client process (the server's CPU is not counted):

- ``ready``: start of ``kopf.operator`` / ``Cache.run`` -> kopf's first ``on.event`` call (kopf
  runs no other handler before every index holds its first list) / ``Cache.synced``; wall
  seconds and process CPU;
- ``caught up``: -> every held FlowRun's key reconciled once;
- ``RSS``: ``VmRSS`` at caught up, and the peak ``VmHWM``;
- ``CPU per event``: after a pause of 6 s (kopf's per-object workers exit 5 s after their last
  event; both sides wait), the server streams the events of R one-node runs (10 per run: FlowRun
  ADDED and 5 MODIFIED, from creation to Succeeded, and the runner pod's ADDED and 3 MODIFIED,
  as the operator, runner and kubelet write them); process CPU (user + system, every thread)
  from the start of the stream to the last event's key reconciled, divided by the events.

Objects are the sizes the operator sees: a FlowRun as the API server stores a finished one-node
run (managedFields of three writers, status with the node's record and output, conditions,
usage, result; 6.4 KB of JSON once finished, 3 KB on average over its life), the runner pod as
``controller/pods.py`` builds it plus the kubelet's status (2.6 KB on average).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION = "agentflows.io", "v1alpha1"
NAMESPACE = "team-a"
PAGE = 500
SETTLE_SECONDS = 6.0
#: A side not caught up by then is reported as such (kopf's start-up grows with N squared).
READY_LIMIT_SECONDS = 300.0
#: The runs whose keys end each stream: the client waits until both are reconciled.
END_RUN, END_POD_RUN = "bench-end", "bench-end-pods"
KINDS = {"agents": "Agent", "flows": "Flow", "flowruns": "FlowRun", "budgets": "Budget"}


# ----- objects ------------------------------------------------------------------------------


def _time(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_764_000_000 + second))


def _managed(manager: str, operation: str, fields: dict[str, Any], sub: str = "") -> dict[str, Any]:
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": f"{GROUP}/{VERSION}",
        "time": _time(1),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    return {**entry, "subresource": sub} if sub else entry


def _status_fields(keys: list[str]) -> dict[str, Any]:
    return {"f:status": {f"f:{k}": {} for k in keys}}


OPERATOR_KEYS = ["attempt", "pod", "phase", "startTime", "snapshotDigest", "conditions"]
RUNNER_KEYS = ["nodes", "output", "usage", "result", "currentNode"]


def flowrun(i: int, stage: int, rv: int, name: str | None = None) -> dict[str, Any]:
    """Run ``i`` at ``stage`` 0 (created) .. 5 (Succeeded), as the API server returns it."""
    name = name or f"run-{i:05d}"
    managed = [
        _managed(
            "agentflows",
            "Update",
            {"f:metadata": {"f:labels": {".": {}, "f:agentflows.io/flow": {}}}, "f:spec": {}},
        )
    ]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "uid": f"00000000-0000-4000-8000-{i:012d}",
        "resourceVersion": str(rv),
        "generation": 1,
        "creationTimestamp": _time(0),
        "labels": {"agentflows.io/flow": "research"},
        "managedFields": managed,
    }
    spec = {"flow": "research", "input": {"topic": f"kopf operators, part {i}"}}
    status: dict[str, Any] = {}
    if stage >= 1:
        managed.append(
            _managed("agentflows-operator", "Update", _status_fields(OPERATOR_KEYS), "status")
        )
        status.update(
            observedGeneration=1,
            phase="Pending",
            attempt=1,
            pod=f"{name}-1",
            startTime=_time(1),
            snapshotDigest="sha256:" + "ab" * 32,
            conditions=[_condition("Succeeded", "Unknown", "Pending", "waiting for the pod")],
        )
    if stage >= 2:
        status.update(phase="Running", podCreated=1, duration="1s")
        status["conditions"] = [_condition("Succeeded", "Unknown", "Running", "pod is running")]
    if stage >= 3:
        managed.append(
            _managed("agentflows-runner", "Update", _status_fields(RUNNER_KEYS), "status")
        )
        status["currentNode"] = "answer"
        status["nodes"] = {"answer": {"phase": "Running", "startedAt": _time(2), "attempts": 1}}
    if stage >= 4:
        text = "Kopf is a Python framework for Kubernetes operators. " * 12
        output = {"json": {"answer": text.strip()}, "text": text.strip(), "raw": text.strip()}
        usage = {"promptTokens": 412, "completionTokens": 187, "costUSD": 0.000174, "llmCalls": 1}
        status.pop("currentNode")
        status["nodes"] = {
            "answer": {
                "phase": "Succeeded",
                "startedAt": _time(2),
                "finishedAt": _time(4),
                "attempts": 1,
                "output": output,
                "usage": usage,
            }
        }
        status.update(output=output, usage=usage)
        status["result"] = {"attempt": 1, "phase": "Succeeded", "finishedAt": _time(4)}
    if stage >= 5:
        status.update(
            phase="Succeeded",
            reason="Succeeded",
            message="all nodes succeeded",
            completionTime=_time(5),
            duration="5s",
            budgetCharged=status["usage"],
        )
        status["conditions"] = [
            _condition("Succeeded", "True", "Succeeded", "all nodes succeeded"),
            _condition("PodCreated", "True", "Created", "pod run created"),
        ]
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FlowRun",
        "metadata": meta,
        "spec": spec,
    }
    if status:
        body["status"] = status
    return body


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": _time(1),
        "observedGeneration": 1,
    }


def runner_pod(i: int, stage: int, rv: int, run_name: str | None = None) -> dict[str, Any]:
    """Run ``i``'s pod at ``stage`` 0 (created) .. 3 (Succeeded): controller/pods.py's spec."""
    from agentflows.api import flow as flow_api
    from agentflows.api import flowrun as flowrun_api
    from agentflows.controller import pods, settings

    run = flowrun(i, 1, rv, run_name)
    spec = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "answer", "llm": {"model": {"name": "openai/gpt-4o-mini"}, "prompt": "x"}}
            ]
        }
    )
    config = settings.OperatorConfig()
    run_status = flowrun_api.status_of(run)
    pod = pods.runner_pod(run, 1, "research", {"research": spec}, {}, config, status=run_status)
    meta = pod["metadata"]
    meta.update(
        uid=f"10000000-0000-4000-8000-{i:012d}",
        resourceVersion=str(rv),
        creationTimestamp=_time(1),
        managedFields=[_managed("agentflows-operator", "Update", {"f:spec": {}})],
    )
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "Burstable"}
    if stage >= 1:
        meta["managedFields"].append(
            _managed("kubelet", "Update", {"f:status": {"f:conditions": {}}}, "status")
        )
        pod["spec"]["nodeName"] = "node-1"
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _time(1)}
        ]
    if stage >= 2:
        status.update(phase="Running", hostIP="10.0.0.1", podIP="10.244.0.17", startTime=_time(1))
        status["conditions"] = [
            {"type": t, "status": "True", "lastTransitionTime": _time(2)}
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ]
        status["containerStatuses"] = [
            {
                "name": "runner",
                "image": "agentflows:0.1.0",
                "imageID": "sha256:" + "cd" * 32,
                "containerID": "containerd://" + "ef" * 32,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": _time(2)}},
            }
        ]
    if stage >= 3:
        status["phase"] = "Succeeded"
        status["containerStatuses"][0].update(
            ready=False,
            started=False,
            state={
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": _time(2),
                    "finishedAt": _time(4),
                    "containerID": "containerd://" + "ef" * 32,
                }
            },
        )
    pod["status"] = status
    return pod


def lifecycle(runs: int, first_rv: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The FlowRun and pod watch events of ``runs`` one-node runs, ending with the two markers."""
    run_events: list[dict[str, Any]] = []
    pod_events: list[dict[str, Any]] = []
    rv = first_rv
    # stage of the run at each step; pods move in between, as the operator and kubelet write
    script = [("run", 0), ("run", 1), ("pod", 0), ("pod", 1), ("pod", 2), ("run", 2)]
    script += [("run", 3), ("run", 4), ("pod", 3), ("run", 5)]
    for i in range(runs):
        index = 50_000 + i
        for kind, stage in script:
            rv += 1
            kind_of = "ADDED" if stage == 0 else "MODIFIED"
            if kind == "run":
                run_events.append({"type": kind_of, "object": flowrun(index, stage, rv)})
            else:
                pod_events.append({"type": kind_of, "object": runner_pod(index, stage, rv)})
    run_events.append({"type": "ADDED", "object": flowrun(99_998, 0, rv + 1, END_RUN)})
    pod_events.append({"type": "ADDED", "object": runner_pod(99_999, 0, rv + 2, END_POD_RUN)})
    return run_events, pod_events


# ----- the fake API server (its own process) ----------------------------------------------


def _discovery() -> dict[str, Any]:
    def resource(plural: str, kind: str, namespaced: bool = True) -> dict[str, Any]:
        return {
            "name": plural,
            "singularName": kind.lower(),
            "namespaced": namespaced,
            "kind": kind,
            "verbs": ["get", "list", "watch", "patch", "create", "delete", "update"],
        }

    crd = {
        "kind": "APIResourceList",
        "groupVersion": f"{GROUP}/{VERSION}",
        "resources": [resource(p, k) for p, k in KINDS.items()]
        + [{**resource(f"{p}/status", k), "verbs": ["get", "patch"]} for p, k in KINDS.items()],
    }
    # kopf waits for its backbone (namespaces, events, CRDs) to be discovered, even unused
    core = [resource("pods", "Pod"), resource("events", "Event")]
    core.append(resource("namespaces", "Namespace", namespaced=False))
    crds = resource("customresourcedefinitions", "CustomResourceDefinition", namespaced=False)
    groups = [(GROUP, VERSION), ("apiextensions.k8s.io", "v1")]
    versions = {g: {"groupVersion": f"{g}/{v}", "version": v} for g, v in groups}
    return {
        "/version": {"major": "1", "minor": "34", "gitVersion": "v1.34.0"},
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": core},
        "/apis": {
            "kind": "APIGroupList",
            "groups": [
                {"name": g, "versions": [versions[g]], "preferredVersion": versions[g]}
                for g, _ in groups
            ],
        },
        f"/apis/{GROUP}/{VERSION}": crd,
        "/apis/apiextensions.k8s.io/v1": {
            "kind": "APIResourceList",
            "groupVersion": "apiextensions.k8s.io/v1",
            "resources": [crds],
        },
    }


def serve(held: int, runs: int) -> None:
    """Serve discovery, lists and watches on 127.0.0.1 until stdin closes; print the port."""
    from aiohttp import web

    list_rv = 10 + held
    collections: dict[str, list[dict[str, Any]]] = {
        f"/apis/{GROUP}/{VERSION}/{p}": [] for p in KINDS
    }
    collections["/api/v1/pods"] = []
    runs_path = f"/apis/{GROUP}/{VERSION}/flowruns"
    collections[runs_path] = [flowrun(i, 5, 10 + i) for i in range(held)]
    run_events, pod_events = lifecycle(runs, list_rv)
    streams = {
        runs_path: b"".join(json.dumps(e).encode() + b"\n" for e in run_events),
        "/api/v1/pods": b"".join(json.dumps(e).encode() + b"\n" for e in pod_events),
    }
    sent: set[str] = set()
    go = asyncio.Event()
    discovery = _discovery()
    stats = {
        "events": len(run_events) + len(pod_events),
        "run_bytes": len(streams[runs_path]) // len(run_events),
        "pod_bytes": len(streams["/api/v1/pods"]) // len(pod_events),
        "held_bytes": len(json.dumps(collections[runs_path][0])) if held else 0,
    }

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if path == "/bench/go":
            go.set()
            return web.json_response(stats)
        if path in discovery:
            return web.json_response(discovery[path])
        if path not in collections:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.query.get("watch") in ("true", "1"):
            return await watch(request, path)
        items = collections[path]
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or len(items) or 1)
        page = items[start : start + limit]
        more = start + limit < len(items)
        meta = {"resourceVersion": str(list_rv), "continue": str(start + limit) if more else ""}
        kind = "PodList" if path.endswith("/pods") else "List"
        return web.json_response(
            {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page}
        )

    async def watch(request: web.Request, path: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await go.wait()
        closing = request.transport is None or request.transport.is_closing()
        if path in streams and path not in sent and not closing:
            # a watch the client gave up on (it watches again) must not take the events
            sent.add(path)
            try:
                await response.write(streams[path])
            except ConnectionResetError:
                sent.discard(path)
                raise
        await asyncio.sleep(float(request.query.get("timeoutSeconds") or 600))
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        os._exit(0)  # the bench is done with it (or gone): open watches are not waited for

    asyncio.run(main())


# ----- the two clients (each in its own process) ------------------------------------------


def _rss_mib() -> tuple[float, float]:
    fields = dict(
        line.split(":", 1)
        for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class Probe:
    """The work queue both sides feed, and the moments the bench waits for."""

    def __init__(self, held: int) -> None:
        from agentflows.controller.runtime import workqueue

        self.workqueue = workqueue
        self.held = held
        self.reconciled: set[str] = set()
        #: (wall, CPU) seconds when each moment came, noted where it happens (not when a waiter
        #: wakes up)
        self.moments: dict[str, tuple[float, float]] = {}
        self.ready = asyncio.Event()
        self.caught_up = asyncio.Event()
        self.ends: set[str] = set()
        self.done = asyncio.Event()
        self.queue = workqueue.WorkQueue(self.reconcile, workers=32)

    async def reconcile(self, key: Any) -> None:
        if key.kind == self.workqueue.FLOWRUN:
            self.reconciled.add(key.name)
            if len(self.reconciled) >= self.held and not self.caught_up.is_set():
                self.note("caught_up", self.caught_up)
            if key.name in (END_RUN, END_POD_RUN):
                self.ends.add(key.name)
        self.settle()

    def settle(self) -> None:
        """Set ``done`` once both ends are reconciled and nothing but this key is left."""
        if len(self.ends) == 2 and self.queue.pending() <= 1:
            self.done.set()

    def note(self, moment: str, event: asyncio.Event) -> None:
        """Note the time of ``moment`` (once) and set ``event``."""
        if moment not in self.moments:
            self.moments[moment] = (time.perf_counter(), time.process_time())
            event.set()

    def enqueue(self, kind: str, namespace: str, name: str, delay: float = 0.0) -> None:
        self.queue.add(self.workqueue.Key(kind, namespace, name), delay)


async def measure(server: str, held: int, start: Callable[[Probe], Any]) -> dict[str, Any]:
    """Start a side, wait for ready, caught up, then stream the events; the figures."""
    import aiohttp

    probe = Probe(held)
    queue = asyncio.create_task(probe.queue.run())
    t0, c0 = time.perf_counter(), time.process_time()
    side = asyncio.create_task(start(probe))
    figures: dict[str, Any] = {}
    try:
        await asyncio.wait_for(probe.caught_up.wait(), READY_LIMIT_SECONDS)
    except TimeoutError:
        figures["not_ready_cpu_s"] = time.process_time() - c0
        figures["rss_mib"], figures["peak_mib"] = _rss_mib()
        print(json.dumps(figures), flush=True)
        os._exit(0)  # without stopping the side: kopf's shutdown waits for its workers
    for moment in ("ready", "caught_up"):
        wall, cpu = probe.moments[moment]
        figures[f"{moment}_s"], figures[f"{moment}_cpu_s"] = wall - t0, cpu - c0
    figures["rss_mib"], figures["peak_mib"] = _rss_mib()
    await asyncio.sleep(SETTLE_SECONDS)
    async with aiohttp.ClientSession() as session:
        c1 = time.process_time()
        async with session.post(f"{server}/bench/go") as response:
            stats = await response.json()
        await probe.done.wait()
        figures["event_cpu_ms"] = (time.process_time() - c1) * 1000 / stats["events"]
        figures.update(stats)
    figures["reconciled"] = len(probe.reconciled)
    side.cancel()
    queue.cancel()
    await asyncio.gather(side, queue, return_exceptions=True)
    return figures


class Noting(asyncio.Event):
    """``Cache.synced`` that notes the moment it is set as the probe's ``ready``."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self._probe = probe

    def set(self) -> None:
        self._probe.note("ready", self._probe.ready)
        super().set()


def run_ours(server: str, held: int) -> dict[str, Any]:
    from agentflows.controller import cache
    from agentflows.kube import client as kube
    from agentflows.kube import kubeconfig_types

    async def main() -> dict[str, Any]:
        api = kube.Client(kubeconfig_types.Config(server=server))

        async def start(probe: Probe) -> None:
            watched = cache.Cache(api, (), lambda _ns: True, probe.enqueue)
            # Cache.run sets synced right after the last first list, before anything else runs
            watched.synced = Noting(probe)
            await watched.run()

        try:
            return await measure(server, held, start)
        finally:
            await api.close()

    return asyncio.run(main())


def run_kopf(server: str, held: int) -> dict[str, Any]:
    import logging

    import kopf

    from agentflows.api import agent as agent_api
    from agentflows.api import flow as flow_api
    from agentflows.api import wellknown
    from agentflows.controller import cache
    from agentflows.controller.runtime import workqueue

    logging.getLogger("kopf").setLevel(logging.WARNING)
    registry = kopf.OperatorRegistry()
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.chunk_size = PAGE
    probe_of: dict[str, Probe] = {}

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server, insecure=True)

    # The same conversions the operator's cache makes: what an index keeps is its function's value.
    @kopf.index(GROUP, VERSION, "flowruns", registry=registry)
    async def runs(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Any:
        run = cache._parse_run(body)
        return {(namespace, name): run} if run is not None else None

    @kopf.index(GROUP, VERSION, "flowruns", registry=registry)
    async def runs_by_flow(spec: kopf.Spec, namespace: str | None, name: str, **_: Any) -> Any:
        return {(namespace, spec.get("flow")): name}

    pod_filter: dict[str, Any] = {
        wellknown.MANAGED_BY: wellknown.MANAGER,
        wellknown.RUN: kopf.PRESENT,
    }

    @kopf.index("", "v1", "pods", labels=pod_filter, registry=registry)
    async def runner_pods(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Any:
        pod = cache._parse_pod(body)
        return {(namespace, name): pod} if pod is not None else None

    @kopf.index(GROUP, VERSION, "agents", registry=registry)
    async def agents(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Any:
        return {(namespace, name): cache._parse_spec(agent_api.AgentSpec, "Agent", body)}

    @kopf.index(GROUP, VERSION, "flows", registry=registry)
    async def flows(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Any:
        return {(namespace, name): cache._parse_spec(flow_api.FlowSpec, "Flow", body)}

    @kopf.index(GROUP, VERSION, "budgets", registry=registry)
    async def budgets(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Any:
        return {(namespace, name): cache._parse_budget(body)}

    @kopf.on.event(GROUP, VERSION, "flowruns", registry=registry)
    async def flowrun_event(name: str, namespace: str | None, **_: Any) -> None:
        probe_of["probe"].note("ready", probe_of["probe"].ready)
        probe_of["probe"].enqueue(workqueue.FLOWRUN, namespace or "", name)

    @kopf.on.event("", "v1", "pods", labels=pod_filter, registry=registry)
    async def pod_event(meta: kopf.Meta, namespace: str | None, **_: Any) -> None:
        probe_of["probe"].note("ready", probe_of["probe"].ready)
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == "FlowRun":
                probe_of["probe"].enqueue(workqueue.FLOWRUN, namespace or "", owner["name"])

    async def main() -> dict[str, Any]:
        async def start(probe: Probe) -> None:
            probe_of["probe"] = probe
            await kopf.operator(
                registry=registry, settings=settings, standalone=True, clusterwide=True
            )

        return await measure(server, held, start)

    return asyncio.run(main())


# ----- the bench --------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(held: int, runs: int) -> Iterator[str]:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(held), str(runs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)


def one_side(side: str, held: int, runs: int) -> dict[str, Any]:
    with server_process(held, runs) as server:
        try:
            return _side_process(side, server, held)
        except subprocess.TimeoutExpired:
            return {"not_ready_cpu_s": float("nan"), "rss_mib": float("nan"), "peak_mib": 0.0}


def _side_process(side: str, server: str, held: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--side", side, server, str(held)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1200,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{side} with {held} held failed:\n{result.stderr}")
    figures: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="200 held FlowRuns, 20 runs' events")
    parser.add_argument(
        "--serve", nargs=2, type=int, metavar=("HELD", "RUNS"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--side", nargs=3, metavar=("SIDE", "SERVER", "HELD"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    if args.side:
        side, server, held = args.side
        figures = (run_kopf if side == "kopf" else run_ours)(server, int(held))
        print(json.dumps(figures), flush=True)
        os._exit(0)  # a side cut off before it was ready may not stop at once
    sizes, runs = ([200], 20) if args.quick else ([1000, 2000, 4000, 10000], 300)
    kopf = importlib.metadata.version("kopf")
    print(f"kopf {kopf} vs ours (controller/cache.py); {runs} runs' events, 10 per run")
    started = time.perf_counter()
    events: dict[str, list[float]] = {"kopf": [], "ours": []}
    for held in sizes:
        for side in ("kopf", "ours"):
            f = one_side(side, held, runs)
            if "not_ready_cpu_s" in f:
                print(
                    f"{side} held {held}: not caught up after {READY_LIMIT_SECONDS:.0f} s "
                    "(or its process after 1200 s: nan) "
                    f"({f['not_ready_cpu_s']:.2f} CPU-s), RSS {f['rss_mib']:.0f} MiB then",
                    flush=True,
                )
                continue
            if f["reconciled"] != held + runs + 2:
                raise SystemExit(
                    f"{side}: {f['reconciled']} runs reconciled, not {held + runs + 2}"
                )
            events[side].append(f["event_cpu_ms"])
            print(
                f"{side} held {held}: ready {f['ready_s']:.2f} s ({f['ready_cpu_s']:.2f} CPU-s), "
                f"caught up {f['caught_up_s']:.2f} s ({f['caught_up_cpu_s']:.2f} CPU-s), "
                f"RSS {f['rss_mib']:.0f} MiB (peak {f['peak_mib']:.0f}), "
                f"CPU per event {f['event_cpu_ms']:.3f} ms",
                flush=True,
            )
    print(
        f"events: {f['events']} (FlowRun {f['run_bytes']} B, pod {f['pod_bytes']} B of JSON on "
        f"average; a held FlowRun {f['held_bytes']} B)"
    )
    kopf_ms, ours_ms = (min(events[s]) for s in ("kopf", "ours"))
    times = f"kopf {kopf_ms:.3f} ms, ours {ours_ms:.3f} ms; kopf/ours x{kopf_ms / ours_ms:.1f}"
    print(f"CPU per event (least of the sizes): {times}")
    wall, load = time.perf_counter() - started, os.getloadavg()[0]
    print(f"(bench wall time {wall:.0f} s, load average {load:.1f})")


if __name__ == "__main__":
    main()
