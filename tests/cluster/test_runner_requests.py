"""The runner's API requests per run, counted by the real API server (issue 13: at most 4).

The FlowRun is prepared as the operator leaves it for a pod (snapshot ConfigMap and its digest,
mounted as the pod's volume would be; ``attempt``, ``pod`` and ``startTime`` in status;
``AGENTFLOWS_ATTEMPT`` in the environment), and the real
``agentflows runner`` console script runs with a token of the runner's ServiceAccount
(config/rbac/runner bound in the test namespace). A FlowSchema matching only that account makes
the API server count its requests (tests/support/api_counts.py), so nothing our client says
about itself is trusted and other clients of the shared control plane do not disturb the count.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentflows.api import runner as runner_api
from agentflows.api import times
from agentflows.kube import client as kube_client
from agentflows.kube import status_store
from tests.cluster import runner_process
from tests.cluster.harness import REPO, Cluster
from tests.cluster.kube_fixtures import crds, kube, kube_namespace, unique
from tests.support import api_counts
from tests.support.fixtures import model_server
from tests.support.model_server import Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster
__all__ = ["crds", "kube", "kube_namespace", "model_server"]

ACCOUNT = "agentflows-runner"


@pytest.fixture
async def counted(
    control_plane: Cluster,
    kube: kube_client.Client,
    kube_namespace: str,
    tmp_path: Path,
) -> AsyncIterator[tuple[Path, str]]:
    """(kubeconfig of the runner's account, FlowSchema counting that account's requests).

    This token is bound to no pod: it reads, and makes the schema count; the runner's writes
    need a token of its run's pod (:func:`pod_kubeconfig`).
    """
    control_plane.kubectl("apply", "-k", str(REPO / "config/rbac/runner"), "-n", kube_namespace)
    config = api_counts.account_kubeconfig(
        control_plane.kubeconfig(), kube_namespace, ACCOUNT, tmp_path / "runner.kubeconfig"
    )
    schema = await api_counts.install_schema(
        kube, f"test-runner-{kube_namespace}", ACCOUNT, kube_namespace
    )
    try:
        async with kube_client.Client.from_env(str(config)) as runner_api:
            await api_counts.wait_until_counted(kube, runner_api, kube_namespace, schema)
        yield config, schema
    finally:
        await api_counts.remove_schema(kube, schema)


async def held_pod(api: kube_client.Client, namespace: str, name: str) -> None:
    """The run's pod ``name`` as an object only: scheduling-gated, so nothing runs it."""
    restricted = {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    await api.create(
        kube_client.path_of("pods", namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": ACCOUNT,
                "schedulingGates": [{"name": "agentflows.io/test-holds-this-pod"}],
                "containers": [
                    {"name": "runner", "image": "agentflows:test", "securityContext": restricted}
                ],
            },
        },
    )


async def prepare(api: kube_client.Client, namespace: str, flow: dict[str, Any]) -> str:
    """A FlowRun of ``flow`` with its snapshot, at attempt 1, as the operator leaves it."""
    name = unique("req")
    status = {"pod": f"{name}-1", "phase": "Pending", "startTime": times.api_time()}
    snapshot = {"flow": "f", "flows": {"f": flow}, "agents": {}}
    await runner_process.prepare(api, namespace, name, snapshot, status)
    return name


async def test_a_one_node_run_costs_the_runner_at_most_three_api_requests_and_no_configmap_read(
    control_plane: Cluster,
    counted: tuple[Path, str],
    kube: kube_client.Client,
    kube_namespace: str,
    model_server: ScriptedModelServer,
) -> None:
    config, schema = counted
    model_server.script(Reply.text("hi"))
    model = {"name": "openai/scripted-model", "apiBase": model_server.url, "retries": 0}
    name = await prepare(
        kube,
        kube_namespace,
        {"nodes": [{"id": "ask", "llm": {"model": model, "prompt": "Say hi"}}]},
    )
    # The runner writes only with a token bound to its run's pod (status.pod), as in a pod.
    await held_pod(kube, kube_namespace, f"{name}-1")
    config = api_counts.account_kubeconfig(
        control_plane.kubeconfig(), kube_namespace, ACCOUNT, config.parent / "pod.kubeconfig",
        pod=f"{name}-1",
    )  # fmt: skip
    # the pod's volume of the run's ConfigMaps, filled (as admin) before counting starts
    volume = await runner_process.fill_volume(control_plane, kube, kube_namespace, name)
    env = {
        **os.environ,
        "KUBECONFIG": str(config),
        "AGENTFLOWS_ATTEMPT": "1",
        runner_api.CONFIGMAPS_ROOT_ENV: str(volume),
    }
    agentflows = str(Path(sys.executable).parent / "agentflows")
    before = await api_counts.requests_of(kube, schema)
    process = await asyncio.create_subprocess_exec(
        agentflows,
        "runner",
        "--namespace",
        kube_namespace,
        "--flowrun",
        name,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, stderr.decode()
    made = await api_counts.requests_of(kube, schema) - before

    status = (await kube.get(kube_client.path_of("flowruns", kube_namespace, name)))["status"]
    assert status["result"] == {
        "attempt": 1,
        "phase": "Succeeded",
        "reason": "Succeeded",
        "finishedAt": status["result"]["finishedAt"],
    }
    assert status["nodes"]["ask"]["phase"] == "Succeeded"
    assert status["nodes"]["ask"]["output"]["text"] == "hi"
    print(f"runner API requests for a one-node run: {made}")
    # read the FlowRun, write the node's record, write the outcome: the snapshot is a file of
    # the pod's (the runner's account may not read a ConfigMap). A node that ran longer than
    # the store's delay (a loaded machine) has its Running record written too.
    record = status["nodes"]["ask"]
    ran = times.elapsed(record["startedAt"], record["finishedAt"])
    assert ran is not None
    running_write = 1 if ran >= status_store.RUNNING_DELAY else 0
    assert made <= 3 + running_write, stderr.decode()  # (a retry the client made is logged there)
