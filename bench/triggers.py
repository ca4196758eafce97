"""Trigger benchmarks on loopback: webhook deliveries per second, and event -> FlowRun latency.

Run ``python bench/triggers.py`` (about 30 s with a warm binary cache) or ``--quick``. It uses
the cluster in ``--kubeconfig`` (admin), else starts a private control plane the way the
cluster tests do (hack/devcluster) and stops it afterwards. Every figure is printed next to a
peer measured in the same run, on the same API server:

- ``webhook``: ``agentflows webhook`` as a subprocess on 127.0.0.1, ``--requests`` signed
  deliveries from ``--concurrency`` connections, each answered 202 with a real FlowRun created.
  Peer: the same number of FlowRun creates sent straight to the API server with the same
  concurrency (the ceiling the receiver cannot beat). Ratio = receiver / direct creates.
- ``event -> flowrun``: a :class:`WatchManager` with one kubernetes trigger on Events; the
  bench creates ``--events`` BackOff Events one at a time (each about a different pod, so none
  is de-duplicated) and times creation -> the FlowRun seen on a watch. Peer: creation -> the
  Event itself seen on a raw watch (the API server's own watch latency). The difference is what
  the trigger adds (match, jq filter, dedup, FlowRun create, its watch delivery).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from agentflows.kube import client as kube
from agentflows.triggers import kubernetes, signing

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Any:
    """Yield an admin kubeconfig path: the given one, or a private control plane's."""
    if kubeconfig:
        yield kubeconfig
        return
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import controlplane

    state_dir = controlplane.temporary_state_dir()
    # the process kubelet: the figures are the triggers', and a test session's real node may be up
    plane = controlplane.start(state_dir, node_kind="process")
    try:
        yield str(plane.kubeconfig("admin"))
    finally:
        controlplane.stop(state_dir)


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        text=True,
        check=True,
        capture_output=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def flow(name: str, trigger: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {"nodes": [{"id": "a", "transform": "=1"}], "triggers": [trigger]},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- webhook -------------------------------------------------------------------------------


async def _blast(count: int, concurrency: int, send: Any) -> tuple[float, dict[int, int]]:
    """Run ``send(i)`` ``count`` times on ``concurrency`` workers; (seconds, status counts)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)
    codes: dict[int, int] = {}

    async def worker() -> None:
        while not queue.empty():
            status = await send(queue.get_nowait())
            codes[status] = codes.get(status, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, codes


@contextlib.asynccontextmanager
async def receiver_process(kubeconfig: str) -> AsyncIterator[str]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "agentflows.cli.main", "webhook", "--host", "127.0.0.1"],
        *["--port", str(port), "--kubeconfig", kubeconfig],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{base}/readyz") as response:
                        if response.status == 200:
                            break
                await asyncio.sleep(0.05)
        yield base
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)


async def bench_webhook(api: kube.Client, kubeconfig: str, ns: str, count: int, conc: int) -> None:
    secret = b"bench-secret"
    await api.create(
        kube.path_of("secrets", ns),
        {"metadata": {"name": "hook"}, "data": {"k": base64.b64encode(secret).decode()}},
    )
    trigger = {
        "name": "push",
        "webhook": {"secret": {"name": "hook", "key": "k"}},
        "input": {"n": "=.run.trigger.payload.n"},
        "rateLimitPerMinute": 100_000,
    }
    await api.create(kube.path_of("flows", ns), flow("hooked", trigger))
    async with receiver_process(kubeconfig) as base, aiohttp.ClientSession() as session:
        url = f"{base}/hooks/{ns}/hooked/push"

        async def deliver(index: int) -> int:
            delivery = str(uuid.uuid4())
            # Each delivery differs, as real ones do: the receiver refuses a replayed body.
            body = json.dumps({"n": index, "delivery": delivery}).encode()
            headers = {
                signing.SIGNATURE_HEADER: signing.signature(secret, body),
                "X-GitHub-Delivery": delivery,
                "Content-Type": "application/json",
            }
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                return response.status

        await _blast(min(20, count), conc, deliver)  # warm caches and connections
        hook_s, hook_codes = await _blast(count, conc, deliver)

    async def direct(index: int) -> int:
        body = {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "FlowRun",
            "metadata": {"generateName": "direct-", "labels": {"agentflows.io/flow": "hooked"}},
            "spec": {"flow": "hooked", "input": {"n": index}},
        }
        await api.create(kube.path_of("flowruns", ns), body)
        return 201

    direct_s, _ = await _blast(count, conc, direct)
    hook_rps, direct_rps = hook_codes.get(202, 0) / hook_s, count / direct_s
    print(
        f"webhook 202/s: {hook_rps:.0f} ({count} requests, {conc} connections, codes {hook_codes})"
    )
    print(f"peer direct FlowRun creates/s: {direct_rps:.0f}")
    print(f"ratio webhook / direct: {hook_rps / direct_rps:.2f}")


# --- event -> FlowRun -----------------------------------------------------------------------


async def _watch_into(
    api: kube.Client, path: str, key: Any, seen: dict[str, asyncio.Future[float]]
) -> None:
    listing = await api.get(path, limit=1)
    version = listing["metadata"]["resourceVersion"]
    while True:
        async for event in api.watch(path, resource_version=version, timeout_seconds=120):
            obj = event.get("object") or {}
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            name = key(obj)
            future = seen.get(name) if name else None
            if future is not None and not future.done():
                future.set_result(time.perf_counter())


async def bench_events(api: kube.Client, ns: str, count: int) -> None:
    trigger = {
        "name": "crash",
        "kubernetes": {
            "apiVersion": "v1",
            "kind": "Event",
            "namespace": ns,
            "fieldSelector": "reason=BackOff",
            "filter": '.event.object.type == "Warning"',
        },
        "input": {"pod": "=.run.trigger.payload.object.involvedObject.name"},
        "rateLimitPerMinute": 100_000,
    }
    flow_obj = await api.create(kube.path_of("flows", ns), flow("doctor", trigger))
    manager = kubernetes.WatchManager(api)
    await manager.sync([flow_obj])
    for _ in range(600):  # the watch has its starting resourceVersion within a second or so
        if all(manager.watches().values()):
            break
        await asyncio.sleep(0.05)
    raw_seen: dict[str, asyncio.Future[float]] = {}
    run_seen: dict[str, asyncio.Future[float]] = {}
    tasks = [
        asyncio.create_task(
            _watch_into(
                api,
                kube.path_of("events", ns),
                lambda o: (o.get("involvedObject") or {}).get("name"),
                raw_seen,
            )
        ),
        asyncio.create_task(
            _watch_into(
                api,
                kube.path_of("flowruns", ns),
                lambda o: ((o.get("spec") or {}).get("input") or {}).get("pod"),
                run_seen,
            )
        ),
    ]
    await asyncio.sleep(0.5)
    raw, runs = [], []
    loop = asyncio.get_running_loop()
    try:
        for index in range(count):
            pod = f"pod-{index}"
            raw_seen[pod], run_seen[pod] = loop.create_future(), loop.create_future()
            started = time.perf_counter()
            await api.create(
                kube.path_of("events", ns),
                {
                    "metadata": {"generateName": f"{pod}."},
                    "involvedObject": {
                        "kind": "Pod",
                        "name": pod,
                        "namespace": ns,
                        "uid": str(uuid.uuid4()),
                    },
                    "reason": "BackOff",
                    "type": "Warning",
                    "message": "Back-off restarting failed container",
                },
            )
            raw.append((await asyncio.wait_for(raw_seen[pod], 30)) - started)
            runs.append((await asyncio.wait_for(run_seen[pod], 30)) - started)
    finally:
        for task in tasks:
            task.cancel()
        await manager.close()
    ms = 1000
    print(
        f"event -> flowrun ms: median {statistics.median(runs) * ms:.1f}, "
        f"p90 {percentile(runs, 0.9) * ms:.1f} ({count} events)"
    )
    print(
        f"peer event -> raw watch ms: median {statistics.median(raw) * ms:.1f}, "
        f"p90 {percentile(raw, 0.9) * ms:.1f}"
    )
    ratio = statistics.median(runs) / statistics.median(raw)
    print(f"ratio event->flowrun / raw watch (median): {ratio:.1f}")


async def main_async(kubeconfig: str, args: argparse.Namespace) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl(kubeconfig, "create", "namespace", ns)
    try:
        async with kube.Client.from_env(kubeconfig, retry_seconds=30) as api:
            await bench_webhook(api, kubeconfig, ns, args.requests, args.concurrency)
            await bench_events(api, ns, args.events)
    finally:
        kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("AGENTFLOWS_BENCH_KUBECONFIG"))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="100 requests, 10 events")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.events = 100, 10
    with cluster(args.kubeconfig) as kubeconfig:
        asyncio.run(main_async(kubeconfig, args))


if __name__ == "__main__":
    main()
