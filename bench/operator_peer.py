"""The peer of bench/operator_scale.py: the least a controller can do, on the `kubernetes` client.

Run by ``operator_scale.py`` as ``python bench/operator_peer.py KUBECONFIG NAMESPACE`` (with the
operator's ServiceAccount token, while no operator runs). It lists and then watches the FlowRuns
of one namespace; for each one without a phase it creates one pod (a single container running
``true``, owner-referenced to the run, labelled ``bench.agentflows.io/run``) from a pool of 8
threads (the operator's default workers). It watches those pods and, when one has ended,
merge-patches its run's ``status.phase`` to Succeeded or Failed from the same pool. Nothing else:
no Flow, no snapshot, no admission, no Events, no retries. What its runs take is what the API
server and a Python client take for the two writes every run needs: the floor the operator's
figures are divided by. Prints ``ready`` once both watches are open; stops on SIGTERM.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, config, watch

GROUP, VERSION = "agentflows.io", "v1alpha1"
LABEL = "bench.agentflows.io/run"
WORKERS = 8


def pod_of(run: dict[str, Any]) -> dict[str, Any]:
    name = run["metadata"]["name"]
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FlowRun",
        "name": name,
        "uid": run["metadata"]["uid"],
        "controller": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-1", "labels": {LABEL: name}, "ownerReferences": [owner]},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "agentflows-runner",
            "automountServiceAccountToken": False,
            "containers": [{"name": "runner", "image": "agentflows:bench", "command": ["true"]}],
        },
    }


def follow(
    list_call: Callable[..., Any], on_event: Callable[[dict[str, Any]], None], **kw: Any
) -> str:
    """List once (handling every item), then watch in a daemon thread; return after the list."""
    body = json.loads(list_call(**kw, _preload_content=False).data)
    for item in body.get("items", []):
        on_event(item)
    version = body["metadata"]["resourceVersion"]

    def loop() -> None:
        nonlocal version
        while True:
            stream = watch.Watch().stream(
                list_call, resource_version=version, timeout_seconds=300, **kw
            )
            try:
                for event in stream:
                    raw = event["raw_object"]
                    version = raw["metadata"].get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        on_event(raw)
            except client.ApiException as error:
                print(f"peer: watch: {error.reason}", file=sys.stderr, flush=True)
                time.sleep(0.5)

    threading.Thread(target=loop, daemon=True).start()
    return str(version)


def main() -> None:
    kubeconfig, namespace = sys.argv[1:3]
    configuration = client.Configuration()
    config.load_kube_config(kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = WORKERS * 2
    api_client = client.ApiClient(configuration)
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    pool = concurrent.futures.ThreadPoolExecutor(WORKERS)
    seen: set[str] = set()
    ended: set[str] = set()
    lock = threading.Lock()

    def report(future: concurrent.futures.Future[Any]) -> None:
        if future.exception() is not None:
            print(f"peer: {future.exception()}", file=sys.stderr, flush=True)

    def on_run(run: dict[str, Any]) -> None:
        name = run["metadata"]["name"]
        with lock:
            if (run.get("status") or {}).get("phase") or name in seen:
                return
            seen.add(name)
        job = pool.submit(
            core.create_namespaced_pod, namespace, pod_of(run), _preload_content=False
        )
        job.add_done_callback(report)

    def on_pod(pod: dict[str, Any]) -> None:
        phase = (pod.get("status") or {}).get("phase")
        run = pod["metadata"]["labels"][LABEL]
        with lock:
            if phase not in ("Succeeded", "Failed") or run in ended:
                return
            ended.add(run)
        patch = {"status": {"phase": phase}}
        job = pool.submit(
            custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, "flowruns", run, patch, _preload_content=False,
        )  # fmt: skip
        job.add_done_callback(report)

    follow(
        custom.list_namespaced_custom_object,
        on_run,
        group=GROUP,
        version=VERSION,
        namespace=namespace,
        plural="flowruns",
    )
    follow(core.list_namespaced_pod, on_pod, namespace=namespace, label_selector=LABEL)
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
