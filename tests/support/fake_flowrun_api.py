"""One FlowRun and its ConfigMaps on a loopback HTTP server, for unit tests of the runner's writes.

Serves what a runner asks of the API server: GET of the FlowRun (and of ConfigMaps, which a
runner may not do: it reads the run's ConfigMaps from its pod's volume, which :attr:`mounted`
stands in for, filled by :meth:`snapshot` and :meth:`mount` as the kubelet fills it), PATCH of
``flowruns/status`` as JSON patch (``add``, ``remove``, ``replace``, ``test``; a missing parent
is a 422, as on the real server) or merge patch, and ConfigMap creates; and what the operator
asks when it follows the run's attempts: pod GETs (kept in ``pods``, a missing one is a 404),
pod creates and Event posts (kept in ``pods`` and ``events``), Role and RoleBinding creates
(a run's sessions grant, kept in ``roles`` and ``rolebindings``), and GETs of the Flows and
Agents in ``flows`` and ``agents``. Every request is recorded with its body, so a test can
count and read the runner's writes. ``refuse`` queues statuses the next status patches are
answered with instead (a 409 lost race, say). The real API server's behaviour is tested in
tests/cluster/test_status_store.py and test_runner*.py.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from agentflows.api import snapshot as snapshot_api
from agentflows.controller import cache, context, settings, snapshots
from agentflows.controller import metrics as metrics_mod
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig, mounted


@dataclasses.dataclass
class Recorded:
    """One request the fake answered."""

    method: str
    path: str
    body: Any
    #: ``time.monotonic()`` when it arrived.
    at: float


class FakeFlowRunApi:
    """FlowRun ``namespace/name`` (status as given) and the ConfigMaps of its namespace."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        spec: dict[str, Any] | None = None,
        status: dict[str, Any] | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.flowrun: dict[str, Any] = {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "FlowRun",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1"},
            "spec": spec or {"flow": "f"},
        }
        if status is not None:
            self.flowrun["status"] = status
        self.configmaps: dict[str, dict[str, Any]] = {}
        #: Flows and Agents the API server holds (GET by name; the operator's cache may lag).
        self.flows: dict[str, dict[str, Any]] = {}
        self.agents: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        #: The Role and RoleBinding of a run's sessions grant, as the operator created them.
        self.roles: dict[str, dict[str, Any]] = {}
        self.rolebindings: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[Recorded] = []
        self.refusals: list[int] = []
        self._mount_dir = tempfile.TemporaryDirectory(prefix="fake-configmaps-")
        #: The pod's volume of the run's ConfigMaps (pass it to ``run_attempt``).
        self.mounted = mounted.Mounted(Path(self._mount_dir.name))

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[kube.Client]:
        """A kube.Client whose requests this fake answers, while its server runs."""
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        api = kube.Client(kubeconfig.Config(server=f"http://127.0.0.1:{port}"), retry_seconds=0)
        try:
            yield api
        finally:
            await api.close()
            await runner.cleanup()

    def snapshot(self, flow: dict[str, Any], agents: dict[str, Any] | None = None) -> None:
        """Store the run's snapshot ConfigMap with ``flow`` as Flow ``f`` (and ``agents``),
        owned by the run."""
        data = {"flow": "f", "flows": {"f": flow}, "agents": agents or {}}
        owner = {"kind": "FlowRun", "name": self.name, "uid": self.flowrun["metadata"]["uid"]}
        text = json.dumps(data)
        self.configmaps[f"{self.name}-snapshot"] = {
            "metadata": {"name": f"{self.name}-snapshot", "ownerReferences": [owner]},
            "data": {"snapshot.json": text},
        }
        self.flowrun.setdefault("status", {})["snapshotDigest"] = snapshot_api.digest_of(text)
        self.mount()

    def mount(self) -> None:
        """Write every ConfigMap's keys to :attr:`mounted`, as a new pod's kubelet would."""
        for name, config_map in self.configmaps.items():
            for key, value in (config_map.get("data") or {}).items():
                path = self.mounted.root / name / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(value)

    def refuse(self, *statuses: int) -> None:
        """Answer the next status patches with these HTTP statuses."""
        self.refusals.extend(statuses)

    @property
    def status(self) -> dict[str, Any]:
        """The FlowRun's status now."""
        status: dict[str, Any] = self.flowrun.get("status") or {}
        return status

    def writes(self) -> list[Recorded]:
        """The status patches that were applied (refused ones left out)."""
        return [r for r in self.requests if r.method == "PATCH" and r.path.endswith("/status")]

    def count(self, method: str, resource: str) -> int:
        """Requests of one method on a resource kind (``flowruns``, ``configmaps``)."""
        return sum(1 for r in self.requests if r.method == method and f"/{resource}/" in r.path)

    async def _answer(self, request: web.Request) -> web.Response:
        content = await request.read()
        body = json.loads(content) if content else None
        path = request.path
        run_path = kube.path_of("flowruns", self.namespace, self.name)
        if request.method == "PATCH" and path == f"{run_path}/status" and self.refusals:
            return _error(self.refusals.pop(0), "refused by the test")
        self.requests.append(Recorded(request.method, path, body, time.monotonic()))
        if path == run_path and request.method == "GET":
            return web.json_response(self.flowrun)
        if path == f"{run_path}/status" and request.method == "PATCH":
            return self._patch(request.headers["content-type"], body)
        for plural, held in (
            ("configmaps", self.configmaps),
            ("pods", self.pods),
            ("flows", self.flows),
            ("agents", self.agents),
            ("roles", self.roles),
            ("rolebindings", self.rolebindings),
        ):
            collection = kube.path_of(plural, self.namespace)
            if path == collection and request.method == "POST":
                held[body["metadata"]["name"]] = body
                return web.json_response(body, status=201)
            if path.startswith(collection + "/") and request.method == "GET":
                found = held.get(path.rsplit("/", 1)[1])
                return web.json_response(found) if found else _error(404, "not found")
        if path == kube.path_of("events", self.namespace) and request.method == "POST":
            self.events.append(body)
            return web.json_response(body, status=201)
        return _error(405, f"the fake does not serve {request.method} {path}")

    def _patch(self, content_type: str, body: Any) -> web.Response:
        updated = copy.deepcopy(self.flowrun)
        try:
            if content_type == kube.JSON_PATCH:
                for op in body:
                    _apply(updated, op)
            else:
                _merge(updated, body)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return _error(422, f"the patch does not apply: {exc}")
        self.flowrun = updated
        return web.json_response(updated)


@contextlib.asynccontextmanager
async def controller_on(fake: FakeFlowRunApi) -> AsyncIterator[context.Controller]:
    """The operator's controller over ``fake``'s API, its cache holding only the FlowRun.

    Nothing else has reached the cache (no Flow, Agent or pod): a test stores what its case
    has seen, and calls a reconciler (``flowruns.reconcile``) itself; the work queue runs none.
    """
    async with fake.client() as api:
        config = settings.OperatorConfig(namespaces=(fake.namespace,), metrics_port=None)
        ctl = context.Controller(api=api, config=config, metrics=metrics_mod.Metrics())
        ctl.cache = cache.Cache(api, config.namespaces, config.owns, ctl.enqueue)
        ctl.snapshots = snapshots.Snapshots(ctl.cache)

        async def not_run(key: workqueue.Key) -> float | None:
            return None

        ctl.queue = workqueue.WorkQueue(not_run, workers=1)
        ctl.cache.stored(fake.flowrun)
        yield ctl


def pod_deleted(ctl: context.Controller, pod: dict[str, Any]) -> None:
    """Give ``ctl``'s cache the pod watch's DELETED event of ``pod``."""
    namespace = pod["metadata"]["namespace"]
    ctl.cache._scope(ctl.cache.pods, namespace)._apply(pod, deleted=True)


def _error(status: int, message: str) -> web.Response:
    body = {"kind": "Status", "reason": "Test", "message": message}
    return web.json_response(body, status=status)


def _apply(obj: dict[str, Any], op: dict[str, Any]) -> None:
    """One JSON patch operation on objects (no arrays in the FlowRun status paths we write)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent = obj
    for part in parts[:-1]:
        parent = parent[part]
    last = parts[-1]
    if op["op"] == "test":
        if parent.get(last) != op["value"]:
            raise ValueError(f"test of {op['path']} failed")
    elif op["op"] in ("add", "replace"):
        if op["op"] == "replace" and last not in parent:
            raise KeyError(op["path"])
        if op["value"] is None:
            parent.pop(last, None)  # the API server prunes nulls from typed fields
        else:
            parent[last] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        del parent[last]
    else:
        raise ValueError(f"unknown op {op['op']}")


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
