"""Triggers on the real control plane: CronJobs that really fire, the webhook receiver against the
real API server with its own least-privilege token, and Event watches that start one run per pod.

No operator runs here: the tests check that the FlowRuns exist with the right trigger; running
them is the operator's part (tests/cluster/test_operator.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from agentflows.api import wellknown
from agentflows.kube import client as kube_client
from agentflows.kube import kubeconfig
from agentflows.triggers import kubernetes, schedule, signing, webhook
from tests.cluster.harness import REPO, Cluster
from tests.cluster.kube_fixtures import crds, kube  # noqa: F401  (fixtures)

from devcluster import appimage  # isort: skip  (hack/ is on sys.path through the harness)

pytestmark = pytest.mark.cluster
T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T | None]], seconds: float, what: str, interval: float = 0.5
) -> T:
    """Poll an async check (the event loop keeps running watches meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    last: T | None = None
    while loop.time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    pytest.fail(f"timed out after {seconds}s waiting for {what} (last value: {last!r})")


def flow_manifest(name: str, triggers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {"nodes": [{"id": "echo", "transform": "=.run.input"}], "triggers": triggers},
    }


async def create_flow(
    api: kube_client.Client, namespace: str, name: str, triggers: list[dict[str, Any]]
) -> dict[str, Any]:
    created: dict[str, Any] = await api.create(
        kube_client.path_of("flows", namespace), flow_manifest(name, triggers)
    )
    return created


async def flowruns(api: kube_client.Client, namespace: str, selector: str) -> list[dict[str, Any]]:
    listing = await api.get(kube_client.path_of("flowruns", namespace), labelSelector=selector)
    items: list[dict[str, Any]] = listing["items"]
    return items


def apply_in_namespace(cluster: Cluster, directory: Path, namespace: str) -> None:
    """Apply a kustomize-style directory as it is, placed in ``namespace`` (subjects too)."""
    for path in sorted(directory.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            cluster.apply(doc)


# --- schedule ----------------------------------------------------------------------------------


async def test_a_schedule_fires_through_the_cronjob_controller_and_the_removed_trigger_goes(
    control_plane: Cluster,
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> None:
    # Restricted pod security is enforced: the trigger pod must pass it to run at all.
    control_plane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    apply_in_namespace(control_plane, REPO / "config/rbac/trigger", namespace)
    flow = await create_flow(
        kube,
        namespace,
        "tick",
        [
            {
                "name": "every_minute",
                "schedule": {"cron": "* * * * *", "timeZone": "Etc/UTC"},
                "input": {"at": "=.run.trigger.scheduledTime", "by": "{{ .run.trigger.type }}"},
            }
        ],
    )
    # the image the node has: the CronJob's pods run in containers
    settings = schedule.Settings(image=f"agentflows:{appimage.app_version()}")
    names = await schedule.sync_cronjobs(kube, flow, settings)
    assert names == ["tick-every-minute-" + names[0].rsplit("-", 1)[1]]
    assert await schedule.sync_cronjobs(kube, flow, settings) == names  # idempotent
    cronjob = control_plane.batch().read_namespaced_cron_job(names[0], namespace)
    assert cronjob.metadata.owner_references[0].uid == flow["metadata"]["uid"]
    assert cronjob.spec.time_zone == "Etc/UTC"

    selector = "agentflows.io/flow=tick,agentflows.io/trigger-type=schedule"

    async def fired() -> list[dict[str, Any]]:
        return await flowruns(kube, namespace, selector)

    (run,) = (await eventually(fired, 180, "a FlowRun from the CronJob"))[:1]
    assert run["spec"]["trigger"]["type"] == "schedule"
    assert run["spec"]["trigger"]["name"] == "every_minute"
    scheduled = run["spec"]["trigger"]["payload"]["scheduledTime"]
    assert run["spec"]["input"] == {"at": scheduled, "by": "schedule"}
    assert run["metadata"]["labels"]["agentflows.io/trigger"] == "every_minute"
    # Named after its Job, so a retried pod cannot create a second run of the same firing.
    assert run["metadata"]["name"].startswith(names[0] + "-")
    pods = control_plane.core().list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={run['metadata']['name']}"
    )
    assert {p.spec.service_account_name for p in pods.items} == {"agentflows-trigger"}

    flow["spec"]["triggers"] = []
    updated = await kube.request("PUT", kube_client.path_of("flows", namespace, "tick"), flow)
    assert await schedule.sync_cronjobs(kube, updated, settings) == []
    listing = control_plane.batch().list_namespaced_cron_job(namespace)
    assert listing.items == []


async def test_changing_a_schedule_updates_its_cronjob(
    control_plane: Cluster,
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> None:
    trigger = {"name": "t", "schedule": {"cron": "0 3 * * *", "suspend": True}}
    flow = await create_flow(kube, namespace, "nightly", [trigger])
    (name,) = await schedule.sync_cronjobs(kube, flow)
    trigger["schedule"] = {"cron": "30 4 * * *", "startingDeadlineSeconds": 60}
    flow["spec"]["triggers"] = [trigger]
    flow = await kube.request("PUT", kube_client.path_of("flows", namespace, "nightly"), flow)
    assert await schedule.sync_cronjobs(kube, flow) == [name]
    cronjob = control_plane.batch().read_namespaced_cron_job(name, namespace)
    assert cronjob.spec.schedule == "30 4 * * *"
    assert cronjob.spec.suspend is False
    assert cronjob.spec.starting_deadline_seconds == 60


# --- webhook -----------------------------------------------------------------------------------


def webhook_client(cluster: Cluster, namespace: str) -> kube_client.Client:
    """A client holding a token of a ServiceAccount bound to config/webhook's ClusterRole only."""
    docs = list(yaml.safe_load_all((REPO / "config/webhook/rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    role["metadata"]["name"] = f"agentflows-webhook-{namespace}"
    cluster.apply(role)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "agentflows-webhook", "namespace": namespace},
        }
    )
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "agentflows-webhook", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "agentflows-webhook", "namespace": namespace}
            ],
        }
    )
    token = cluster.core().create_namespaced_service_account_token(
        "agentflows-webhook", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    admin = kubeconfig.load(str(cluster.kubeconfig()))
    config = kubeconfig.Config(server=admin.server, ca_file=admin.ca_file, token=token.status.token)
    return kube_client.Client(config, retry_seconds=10)


@pytest.fixture
async def receiver(
    control_plane: Cluster,
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> AsyncIterator[TestClient[Any, Any]]:
    await kube.create(
        kube_client.path_of("secrets", namespace),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hook"},
            "data": {"hmac": base64.b64encode(b"s3cret").decode()},
        },
    )
    await create_flow(
        kube,
        namespace,
        "ci",
        [
            {
                "name": "push",
                "webhook": {"secret": {"name": "hook", "key": "hmac"}},
                "input": {"ref": "=.run.trigger.payload.ref"},
                "rateLimitPerMinute": 3,
            }
        ],
    )
    async with webhook_client(control_plane, namespace) as api:
        settings = webhook.Settings(namespaces=(namespace,))
        server = TestServer(webhook.make_app(api, settings), host="127.0.0.1")
        async with TestClient(server) as test_client:

            async def ready() -> bool:
                return (await test_client.get("/readyz")).status == 200

            await eventually(ready, 30, "the receiver to list Flows")
            yield test_client


def signed(body: bytes, key: bytes = b"s3cret", delivery: str | None = None) -> dict[str, str]:
    headers = {signing.SIGNATURE_HEADER: signing.signature(key, body)}
    if delivery:
        headers["X-GitHub-Delivery"] = delivery
    return headers


async def test_webhook_accepts_signed_deliveries_once_and_rejects_the_rest(
    receiver: TestClient[Any, Any],
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> None:
    url = f"/hooks/{namespace}/ci/push"
    body = json.dumps({"ref": "refs/heads/main"}).encode()
    delivery = str(uuid.uuid4())

    accepted = await receiver.post(url, data=body, headers=signed(body, delivery=delivery))
    assert accepted.status == 202, await accepted.text()
    name = (await accepted.json())["flowRun"]
    run = await kube.get(kube_client.path_of("flowruns", namespace, name))
    assert run["spec"]["trigger"] == {
        "type": "webhook",
        "name": "push",
        "payload": {"ref": "refs/heads/main"},
    }
    assert run["spec"]["input"] == {"ref": "refs/heads/main"}
    assert run["metadata"]["annotations"][wellknown.DELIVERY_ANNOTATION] == delivery

    replay = await receiver.post(url, data=body, headers=signed(body, delivery=delivery))
    assert replay.status == 200
    assert await replay.json() == {"flowRun": name, "duplicate": True}

    rejected = {
        "no signature": await receiver.post(url, data=body),
        "bad signature": await receiver.post(url, data=body, headers=signed(body, key=b"guess")),
        "tampered body": await receiver.post(url, data=body + b" ", headers=signed(body)),
        "not JSON": await receiver.post(url, data=b"ref=main", headers=signed(b"ref=main")),
        "oversized": await receiver.post(
            url, data=b" " * (webhook.MIB + 1), headers=signed(b" " * (webhook.MIB + 1))
        ),
        "unknown trigger": await receiver.post(
            f"/hooks/{namespace}/ci/other", data=body, headers=signed(body)
        ),
        "unknown flow": await receiver.post(
            f"/hooks/{namespace}/nope/push", data=body, headers=signed(body)
        ),
    }
    assert {what: r.status for what, r in rejected.items()} == {
        "no signature": 401,
        "bad signature": 401,
        "tampered body": 401,
        "not JSON": 400,
        "oversized": 413,
        "unknown trigger": 401,
        "unknown flow": 401,
    }

    # rateLimitPerMinute 3: one token went to the first delivery, two remain.
    bodies = [json.dumps({"ref": f"refs/heads/b{i}"}).encode() for i in range(3)]
    codes = [
        (await receiver.post(url, data=b, headers=signed(b, delivery=f"d{i}"))).status
        for i, b in enumerate(bodies)
    ]
    assert codes == [202, 202, 429]
    runs = await flowruns(kube, namespace, "agentflows.io/flow=ci,agentflows.io/trigger=push")
    assert len(runs) == 3
    assert {r["metadata"]["labels"]["agentflows.io/trigger-type"] for r in runs} == {"webhook"}


async def test_the_receiver_follows_flows_created_and_deleted_after_it_started(
    receiver: TestClient[Any, Any],
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> None:
    trigger = {"name": "push", "webhook": {"secret": {"name": "hook", "key": "hmac"}}}
    await create_flow(kube, namespace, "late", [trigger])
    url = f"/hooks/{namespace}/late/push"

    async def delivered(index: int) -> int:
        body = json.dumps({"n": index, "at": str(uuid.uuid4())}).encode()
        return (await receiver.post(url, data=body, headers=signed(body))).status

    async def accepted() -> bool:
        return await delivered(0) == 202

    await eventually(accepted, 30, "the receiver to see the new Flow")
    await kube.delete(kube_client.path_of("flows", namespace, "late"))

    async def forgotten() -> bool:
        return await delivered(1) == 401

    await eventually(forgotten, 30, "the receiver to forget the deleted Flow")


# --- kubernetes --------------------------------------------------------------------------------


def sleeping_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "app",
                    "command": ["python", "-c", "import time; time.sleep(300)"],
                }
            ],
        },
    }


async def create_event(
    api: kube_client.Client, namespace: str, pod: dict[str, Any], reason: str
) -> dict[str, Any]:
    meta = pod["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": namespace,
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": "Back-off restarting failed container main",
        "type": "Warning",
        "count": 1,
        "source": {"component": "kubelet"},
    }
    created: dict[str, Any] = await api.create(kube_client.path_of("events", namespace), body)
    return created


async def test_a_crash_looping_pod_starts_one_run_and_a_removed_trigger_stops_the_watch(
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> None:
    trigger = {
        "name": "crashloop",
        "kubernetes": {
            "apiVersion": "v1",
            "kind": "Event",
            "namespace": namespace,
            "fieldSelector": "involvedObject.kind=Pod,reason=BackOff",
            "filter": '.event.object.type == "Warning"',
            "dedupWindowSeconds": 600,
        },
        "input": {
            "pod": "=.run.trigger.payload.object.involvedObject.name",
            "namespace": "=.run.trigger.payload.object.involvedObject.namespace",
        },
    }
    flow = await create_flow(kube, namespace, "doctor", [trigger])
    manager = kubernetes.WatchManager(kube)
    try:
        await manager.sync([flow])

        async def established() -> bool:
            return manager.watches() == {("v1", "Event"): True}

        await eventually(established, 30, "the Event watch")
        pods = [
            await kube.create(kube_client.path_of("pods", namespace), sleeping_pod(name))
            for name in ("web-0", "web-1", "sentinel")
        ]
        for _ in range(3):
            for pod in pods[:2]:
                event = await create_event(kube, namespace, pod, "BackOff")
        # A MODIFIED event (the kubelet bumps count) and an unrelated reason change nothing.
        await kube.merge_patch(
            kube_client.path_of("events", namespace, event["metadata"]["name"]), {"count": 7}
        )
        await create_event(kube, namespace, pods[0], "Pulled")
        # Events arrive in order on the watch: once the sentinel's run exists, all came through.
        await create_event(kube, namespace, pods[2], "BackOff")

        async def sentinel_run() -> list[dict[str, Any]]:
            runs = await flowruns(kube, namespace, "agentflows.io/flow=doctor")
            return [r for r in runs if r["spec"]["input"]["pod"] == "sentinel"]

        await eventually(sentinel_run, 60, "the sentinel pod's run")
        runs = await flowruns(kube, namespace, "agentflows.io/flow=doctor")
        assert sorted(r["spec"]["input"]["pod"] for r in runs) == ["sentinel", "web-0", "web-1"]
        for run in runs:
            assert run["spec"]["trigger"]["type"] == "kubernetes"
            assert run["spec"]["trigger"]["payload"]["object"]["reason"] == "BackOff"
            assert run["spec"]["input"]["namespace"] == namespace
            assert run["metadata"]["labels"]["agentflows.io/trigger"] == "crashloop"

        flow["spec"]["triggers"] = []
        await manager.sync([flow])
        assert manager.watches() == {}
    finally:
        await manager.close()


async def test_watches_are_shared_per_kind_and_follow_flow_changes(
    namespace: str,
    kube: kube_client.Client,  # noqa: F811
) -> None:
    def on(kind: str, api_version: str = "v1") -> dict[str, Any]:
        return {"name": kind.lower(), "kubernetes": {"apiVersion": api_version, "kind": kind}}

    first = await create_flow(kube, namespace, "a", [on("Event"), on("ConfigMap")])
    second = await create_flow(kube, namespace, "b", [on("Event")])
    manager = kubernetes.WatchManager(kube)
    try:
        await manager.sync([first, second])
        assert set(manager.watches()) == {("v1", "Event"), ("v1", "ConfigMap")}
        await manager.sync([second])
        assert set(manager.watches()) == {("v1", "Event")}
        await manager.sync([])
        assert manager.watches() == {}
    finally:
        await manager.close()
