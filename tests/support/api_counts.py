"""Count one ServiceAccount's API requests as the API server counts them (not as our client does).

Used by ``bench/runner_start.py``, ``tests/cluster/test_runner_requests.py`` and
``tests/cluster/test_attack_webhook.py``. A FlowSchema matching only that account (ahead of the
built-in schemas) makes the API server's priority-and-fairness filter label each of its
requests with the schema's name, so ``apiserver_flowcontrol_dispatched_requests_total`` of the
schema counts that account alone, whatever else the shared control plane serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
from pathlib import Path

import yaml

from agentflows.kube import client as kube_client
from agentflows.kube import objects

FLOWSCHEMAS = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"


async def install_schema(api: kube_client.Client, name: str, account: str, namespace: str) -> str:
    """Create (or keep) FlowSchema ``name`` for ServiceAccount ``namespace/account``; return ``name``.

    The API server applies a new schema within moments, not at once: count from a request the
    account made after it (see :func:`requests_of`) rather than from zero.
    """
    body = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": "workload-low"},
            "matchingPrecedence": 100,
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {"name": account, "namespace": namespace},
                        }
                    ],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "namespaces": ["*"],
                            "clusterScope": True,
                        }
                    ],
                }
            ],
        },
    }
    await objects.create_or_get(api, FLOWSCHEMAS, body)
    return name


async def remove_schema(api: kube_client.Client, name: str) -> None:
    """Delete FlowSchema ``name`` (gone already is fine)."""
    await api.delete(f"{FLOWSCHEMAS}/{name}")


async def wait_until_counted(
    api: kube_client.Client, account: kube_client.Client, namespace: str, schema: str
) -> None:
    """Make requests as the account until the API server counts them under ``schema``."""
    before = await requests_of(api, schema)
    for _ in range(60):
        with contextlib.suppress(kube_client.ApiError):  # a 404 is counted all the same
            await account.get(kube_client.path_of("configmaps", namespace, "probe"))
        if await requests_of(api, schema) > before:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"FlowSchema {schema} counted no request in 30 s")


async def requests_of(api: kube_client.Client, schema: str) -> int:
    """How many requests the API server dispatched for ``schema`` (all verbs)."""
    text = await api.request_text("GET", "/metrics")
    pattern = re.compile(
        r'^apiserver_flowcontrol_dispatched_requests_total\{[^}]*flow_schema="'
        + re.escape(schema)
        + r'"[^}]*\} (\S+)$',
        re.MULTILINE,
    )
    return sum(int(float(value)) for value in pattern.findall(text))


def account_kubeconfig(
    admin: Path, namespace: str, account: str, path: Path, pod: str | None = None
) -> Path:
    """Write ``path``: a kubeconfig for the cluster of ``admin`` with a token of the account.

    With ``pod``, the token is bound to that pod, as a kubelet's projected token is (the
    runner's admission policy takes writes only from such a token of the run's pod).
    """
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}"] if pod else []
    token = subprocess.run(
        ["kubectl", f"--kubeconfig={admin}", "create", "token", account, "-n", namespace, *bound],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    cluster = yaml.safe_load(admin.read_text())["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
