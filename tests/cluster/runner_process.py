"""``agentflows runner`` as a process, fed as the operator feeds a pod, for cluster tests.

:func:`prepare` creates what the operator leaves for a pod: the FlowRun, its snapshot ConfigMap
owned by it, ``status.snapshotDigest`` and the attempt. :func:`run` fills the run's ConfigMaps
volume as the kubelet would, from the volume the operator would put in the pod
(:func:`agentflows.controller.pods.config_map_volume`; for a snapshot whose specs do not parse,
the snapshot and the offloaded parts only), and runs the runner with a kubeconfig (admin unless
one is given) and ``AGENTFLOWS_CONFIGMAPS_ROOT`` pointing at that volume.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import pydantic

from agentflows.api import flowrun as flowrun_api
from agentflows.api import runner as runner_api
from agentflows.api import snapshot as snapshot_api
from agentflows.controller import pods
from agentflows.kube import client as kube_client
from agentflows.kube import mounted, status_store
from agentflows.kube import snapshot as snapshot_mod
from tests.cluster.harness import Cluster
from tests.support import kubelet_volume


@dataclasses.dataclass
class Finished:
    """How a runner process ended."""

    returncode: int
    stdout: str
    stderr: str


async def prepare(
    api: kube_client.Client,
    namespace: str,
    name: str,
    snapshot: dict[str, Any],
    status: dict[str, Any] | None = None,
    input_value: Any = None,
) -> dict[str, Any]:
    """The FlowRun ``name`` of ``snapshot["flow"]`` as the operator leaves it for attempt 1."""
    spec: dict[str, Any] = {"flow": snapshot["flow"]}
    if input_value is not None:
        spec["input"] = input_value
    obj: dict[str, Any] = await api.create(
        kube_client.path_of("flowruns", namespace),
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "FlowRun",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    owner = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "name": name,
        "uid": obj["metadata"]["uid"],
    }
    text = json.dumps(snapshot)
    await api.create(
        kube_client.path_of("configmaps", namespace),
        {
            "metadata": {"name": snapshot_mod.snapshot_name(name), "ownerReferences": [owner]},
            "data": {snapshot_mod.SNAPSHOT_KEY: text},
        },
    )
    prepared = {"attempt": 1, "snapshotDigest": snapshot_api.digest_of(text), **(status or {})}
    path = kube_client.path_of("flowruns", namespace, name, sub="status")
    stored: dict[str, Any] = await api.merge_patch(path, {"status": prepared})
    return stored


def volume_root(cluster: Cluster, namespace: str, name: str) -> Path:
    """Where the process's stand-in for the pod's ConfigMaps volume is."""
    return cluster.cp.state_dir / "runner-volumes" / namespace / name


async def fill_volume(cluster: Cluster, api: kube_client.Client, namespace: str, name: str) -> Path:
    """Fill the run's ConfigMaps volume as a new pod's kubelet would; return its root."""
    run = await api.get(kube_client.path_of("flowruns", namespace, name))
    taken = await snapshot_mod.read_snapshot(api, namespace, name)
    try:
        volume = pods.config_map_volume(
            run, flowrun_api.status_of(run), taken.flow_specs, taken.agent_specs
        )
    except pydantic.ValidationError:  # a run that is to fail with FlowInvalid
        snapshot = (snapshot_mod.snapshot_name(name), snapshot_mod.SNAPSHOT_KEY)
        offloaded = status_store.offloaded_parts(flowrun_api.status_of(run))
        volume = mounted.volume([snapshot], offloaded)
    root = volume_root(cluster, namespace, name)
    await kubelet_volume.fill(api, namespace, volume, root)
    return root


async def start(
    cluster: Cluster,
    api: kube_client.Client,
    namespace: str,
    name: str,
    kubeconfig: Path | None = None,
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Start the runner of ``name`` after filling its volume."""
    root = await fill_volume(cluster, api, namespace, name)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentflows.cli.main",
        "runner",
        "--namespace",
        namespace,
        "--flowrun",
        name,
        env={
            **os.environ,
            "KUBECONFIG": str(kubeconfig or cluster.kubeconfig()),
            runner_api.CONFIGMAPS_ROOT_ENV: str(root),
            **(env or {}),
        },
        stdout=PIPE,
        stderr=PIPE,
    )


async def run(
    cluster: Cluster,
    api: kube_client.Client,
    namespace: str,
    name: str,
    kubeconfig: Path | None = None,
    env: dict[str, str] | None = None,
) -> Finished:
    """Run the runner of ``name`` to its end."""
    process = await start(cluster, api, namespace, name, kubeconfig, env)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return Finished(process.returncode, stdout.decode(), stderr.decode())
