"""charts/agentflows and the per-namespace kustomize identity, on the real control plane.

The chart is installed with the pinned helm (``hack/control-plane build-helm``). Every rendered
manifest passes a server-side dry run first; then ``helm install`` brings up the operator as a
Deployment of the chart's two replicas (one leads on the Lease), the webhook receiver and the
console, in containers of the image built from the Dockerfile on the real node, reached at
their pods' addresses on the bridge; that operator runs Flows in a namespace of
``runnerNamespaces``. The RBAC is the real thing: a
user holding only the built-in ``edit`` role creates the Flow and FlowRun (aggregation), and one
bound only to ``agentflows-approver`` decides the run's approval. ``helm upgrade`` with changed
values rolls the operator while a run waits, and the run goes on. ``helm uninstall`` leaves the
CRDs and nothing else of the release. The kustomize path is tested too: the README's
``kubectl apply -k config/rbac/runner -n team-a``, verbatim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from agentflows.api import crd
from tests.cluster.harness import REPO, Cluster, Helm, adopt_into_helm_release, wait_for

from devcluster import node  # isort: skip  (hack/ is on sys.path through the harness)

pytestmark = pytest.mark.cluster

CHART = REPO / "charts" / "agentflows"
EDITOR = "alice"  # group editors; no RBAC of its own
APPROVER = "bob"  # group viewers; no RBAC of its own


def _create_namespace(cluster: Cluster, name: str) -> None:
    cluster.core().create_namespace(
        {
            "metadata": {
                "name": name,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
            }
        }
    )


@pytest.fixture
def helm(control_plane: Cluster) -> Helm:
    return Helm(control_plane)


@pytest.fixture
def namespaces(control_plane: Cluster) -> Iterator[tuple[str, str]]:
    """(the release's namespace, a namespace that runs flows), both restricted."""
    suffix = uuid.uuid4().hex[:8]
    names = (f"af-system-{suffix}", f"team-{suffix}")
    for name in names:
        _create_namespace(control_plane, name)
    yield names
    for name in names:
        control_plane.core().delete_namespace(name)


def _run_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    run = client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object(
        "agentflows.io", "v1alpha1", namespace, "flowruns", name
    )
    status: dict[str, Any] = run.get("status") or {}
    return status


def _wait_phase(cluster: Cluster, namespace: str, name: str, *phases: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = _run_status(cluster, namespace, name)
        return status if status.get("phase") in phases else None

    return wait_for(reached, 180, f"FlowRun {namespace}/{name} in {phases}")


def _allowed(cluster: Cluster, user: str, verb: str, resource: str, namespace: str) -> bool:
    """Whether RBAC lets ``user`` do ``verb`` on ``resource`` (``group/plural[/subresource]``)."""
    group, plural, *sub = resource.split("/")
    review = client.AuthorizationV1Api(cluster.api()).create_subject_access_review(
        {
            "spec": {
                "user": user,
                "groups": [],
                "resourceAttributes": {
                    "group": group,
                    "resource": plural,
                    "subresource": "".join(sub),
                    "verb": verb,
                    "namespace": namespace,
                },
            }
        }
    )
    return bool(review.status.allowed)


def test_the_readme_kustomize_command_gives_a_namespace_its_runner_identity(
    control_plane: Cluster,
) -> None:
    control_plane.core().create_namespace({"metadata": {"name": "team-a"}})
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig())}
    for component in ("runner", "trigger"):
        done = subprocess.run(
            ["kubectl", "apply", "-k", f"config/rbac/{component}", "-n", "team-a"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"serviceaccount/agentflows-{component} created" in done.stdout
    runner = "system:serviceaccount:team-a:agentflows-runner"
    trigger = "system:serviceaccount:team-a:agentflows-trigger"
    for account, verb, resource in (
        (runner, "get", "agentflows.io/flowruns"),
        (runner, "patch", "agentflows.io/flowruns/status"),
        (runner, "create", "/configmaps"),
        (trigger, "create", "agentflows.io/flowruns"),
    ):
        assert _allowed(control_plane, account, verb, resource, "team-a"), (account, verb, resource)
    assert not _allowed(control_plane, runner, "get", "agentflows.io/flowruns", "default")


def _bind(cluster: Cluster, namespace: str, role: str, user: str) -> None:
    cluster.kubectl(
        "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
        f"--user={user}", "-n", namespace,
    )  # fmt: skip


def _rendered(helm: Helm, release: str, namespace: str, values: list[str]) -> list[dict[str, Any]]:
    done = helm("template", release, str(CHART), "-n", namespace, *values)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _exists(cluster: Cluster, doc: dict[str, Any]) -> bool:
    meta = doc["metadata"]
    where = ["-n", meta["namespace"]] if meta.get("namespace") else []
    group = doc["apiVersion"].rpartition("/")[0]
    kind = f"{doc['kind'].lower()}.{group}" if group else doc["kind"].lower()
    done = cluster.kubectl("get", kind, meta["name"], *where, "-o", "name", check=False)
    if done.returncode == 0:
        return True
    assert "NotFound" in done.stderr, done.stderr
    return False


def _operator_pods(cluster: Cluster, namespace: str) -> list[str]:
    """Names of the live operator pods of the release in ``namespace``."""
    pods = cluster.core().list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/component=operator"
    )
    return [p.metadata.name for p in pods.items if not p.metadata.deletion_timestamp]


def _lease_holder(cluster: Cluster, namespace: str) -> str:
    """Who holds the operator's Lease in the release namespace (a pod name, from POD_NAME)."""
    lease = client.CoordinationV1Api(cluster.api()).read_namespaced_lease(
        "agentflows-operator", namespace
    )
    return str(lease.spec.holder_identity or "")


def _flows(approver: str) -> list[dict[str, Any]]:
    gate = [
        {"id": "review", "approval": {"message": "Ship it?", "approvers": {"users": [approver]}}},
        {"id": "after", "transform": "={decision: .nodes.review.json.decision}"},
    ]
    hello = [{"id": "greet", "transform": '={greeting: ("hello " + .run.input.name)}'}]
    return [
        {"kind": "Flow", "metadata": {"name": name}, "spec": {"nodes": nodes, "output": out}}
        for name, nodes, out in (
            ("hello", hello, "=.nodes.greet.json"),
            ("gate", gate, "=.nodes.after.json"),
        )
    ]


def _as_editor(cluster: Cluster, namespace: str, *documents: dict[str, Any]) -> None:
    for document in documents:
        document = {"apiVersion": "agentflows.io/v1alpha1", **document}
        document["metadata"]["namespace"] = namespace
        cluster.apply(document, user=EDITOR)


def _run(name: str, flow: str, value: Any = None) -> dict[str, Any]:
    return {"kind": "FlowRun", "metadata": {"name": name}, "spec": {"flow": flow, "input": value}}


def _address(cluster: Cluster, namespace: str, component: str) -> str:
    """``ip:8080`` of a running pod of the release's ``component`` (the chart's default port)."""

    def found() -> str | None:
        pods = cluster.core().list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/component={component}"
        )
        for pod in pods.items:
            if pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
                return f"{pod.status.pod_ip}:8080"
        return None

    return wait_for(found, 120, f"a running {component} pod in {namespace}")


def _get(address: str, path: str) -> str | None:
    """The body of a 200 answer from ``address`` (a pod's ``ip:port``), or None while nothing
    answers there."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return response.read().decode() if response.status == 200 else None
    except OSError:
        return None


def _check_before_install(helm: Helm, cluster: Cluster, system: str, values: list[str]) -> None:
    """Every rendered manifest passes a server-side dry run; a typo in values is refused."""
    manifests = _rendered(helm, "agentflows", system, values)
    listed = json.dumps({"kind": "List", "apiVersion": "v1", "items": manifests})
    dry_run = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=listed)
    assert len(dry_run.stdout.splitlines()) == len(manifests), dry_run.stdout
    typo = helm("install", "agentflows", str(CHART), "-n", system, *values,
                "--set", "webhook.enabeld=true", check=False)  # fmt: skip
    assert typo.returncode != 0
    assert "at '/webhook': additional properties 'enabeld' not allowed" in typo.stderr


def _upgrade_rolls_the_operator(helm: Helm, cluster: Cluster, system: str) -> None:
    before = _operator_pods(cluster, system)
    helm("upgrade", "agentflows", str(CHART), "-n", system, "--reuse-values",
         "--set", "operator.workers=3", "--wait", "--timeout=5m")  # fmt: skip
    # --wait saw the rollout done: every replica is a new pod, one at a time (maxSurge 0)
    after = wait_for(
        lambda: (pods := _operator_pods(cluster, system)) and not set(pods) & set(before) and pods,
        120,
        "the operator's pods to be replaced",
    )
    for pod in after:
        assert "--workers=3" in cluster.pod(system, pod).spec.containers[0].command
    wait_for(lambda: _lease_holder(cluster, system) in after, 60, "a new pod to hold the Lease")


def _uninstall_leaves_only_the_crds(
    helm: Helm, cluster: Cluster, system: str, manifests: list[dict[str, Any]]
) -> None:
    helm("uninstall", "agentflows", "-n", system, "--wait", "--timeout=5m")
    left = {
        f"{doc['kind']} {doc['metadata']['name']}" for doc in manifests if _exists(cluster, doc)
    }
    assert left == {
        f"CustomResourceDefinition {plural}.agentflows.io"
        for plural in (resource.plural for resource in crd.RESOURCES)
    }
    wait_for(
        lambda: not cluster.core().list_namespaced_pod(system).items,
        120,
        f"the operator's and the receiver's pods in {system} to go",
    )


def _console_acts_as_the_proxys_user(address: str, team: str) -> None:
    """The chart's console answers only for a user the proxy names, and sees what they may.

    This host, at the bridge address, is the proxy the console trusts."""
    wait_for(lambda: _get(address, "/healthz") is not None, 60, "the console's probe")
    url = f"http://{address}/runs?namespace={team}"
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(url, timeout=30)
    assert anonymous.value.code == 401
    request = urllib.request.Request(url, headers={"X-Forwarded-User": EDITOR})
    with urllib.request.urlopen(request, timeout=30) as answer:
        page = answer.read().decode()
    assert ">hello-1<" in page and f'<span class="user">{EDITOR}</span>' in page


def test_helm_install_upgrade_and_uninstall_with_editors_running_flows_and_approvers_deciding(
    control_plane: Cluster, helm: Helm, namespaces: tuple[str, str]
) -> None:
    system, team = namespaces
    # The chart's defaults otherwise: two operator replicas on the Lease, port 8080 in each pod.
    values = [
        "--set", f"runnerNamespaces={{{team}}}",
        "--set", "webhook.enabled=true",
        "--set", "console.enabled=true",
        "--set", f"console.trustProxyFrom={node.NODE_IP}/32",
    ]  # fmt: skip
    _check_before_install(helm, control_plane, system, values)
    # what kustomize installed for earlier test modules is handed to the release first
    adopt_into_helm_release(
        control_plane, _rendered(helm, "agentflows", system, values), "agentflows", system
    )
    started = time.monotonic()
    helm("install", "agentflows", str(CHART), "-n", system, *values, "--wait", "--timeout=5m")
    operator = _address(control_plane, system, "operator")
    wait_for(lambda: _get(operator, "/healthz") is not None, 60, "the operator's probe")
    assert "agentflows_" in (_get(operator, "/metrics") or "")
    webhook = _address(control_plane, system, "webhook")
    wait_for(lambda: _get(webhook, "/healthz") is not None, 60, "the receiver's probe")
    _bind(control_plane, team, "edit", EDITOR)
    _bind(control_plane, team, "agentflows-approver", APPROVER)
    wait_for(
        lambda: _allowed(control_plane, EDITOR, "create", "agentflows.io/flowruns", team),
        60,
        "the edit role to aggregate agentflows-edit",
    )
    _as_editor(control_plane, team, *_flows(APPROVER), _run("hello-1", "hello", {"name": "helm"}))
    status = _wait_phase(control_plane, team, "hello-1", "Succeeded", "Failed")
    print(f"helm install -> first FlowRun Succeeded: {time.monotonic() - started:.1f}s")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"greeting": "hello helm"}
    _console_acts_as_the_proxys_user(_address(control_plane, system, "console"), team)
    assert control_plane.pod(team, "hello-1-1").spec.service_account_name == "agentflows-runner"
    assert _lease_holder(control_plane, system) in _operator_pods(control_plane, system)

    _as_editor(control_plane, team, _run("gate-1", "gate"))
    status = _wait_phase(control_plane, team, "gate-1", "Waiting", "Failed")
    assert status["phase"] == "Waiting", status.get("message")
    assert not _allowed(control_plane, EDITOR, "patch", "agentflows.io/flowruns/status", team)
    # An upgrade with changed values rolls the operator; the waiting run goes on under the new one.
    _upgrade_rolls_the_operator(helm, control_plane, system)
    approve = subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", "approve", "gate-1", "-n", team,
         "--kubeconfig", str(control_plane.kubeconfig(APPROVER))],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert approve.returncode == 0, approve.stdout + approve.stderr
    status = _wait_phase(control_plane, team, "gate-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"decision": "approve"}
    assert status["requests"]["review"]["decidedBy"] == APPROVER

    manifests = _rendered(helm, "agentflows", system, values)
    _uninstall_leaves_only_the_crds(helm, control_plane, system, manifests)
