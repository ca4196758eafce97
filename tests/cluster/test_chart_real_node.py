"""``helm install`` of charts/agentflows on the real node: the operator runs in its container.

The module runs on the session's shared real node (the default of tests/cluster/conftest.py),
whose containerd holds ``agentflows:<appVersion>`` built from the project's ``Dockerfile``. The
chart is installed with its defaults (two operator replicas with leader election, the image
``agentflows:<appVersion>`` with ``pullPolicy: IfNotPresent``) plus ``runnerNamespaces`` naming
the test's namespace, and ``--wait`` waits for the Deployment's pods to pass their probes, which
the kubelet sends to each pod's address on the bridge. The operator inside reaches the API server
through the ``kubernetes`` Service with its mounted token; the runner pods it creates run in
containers of the same image. ``helm uninstall`` at the end leaves the shared node to the next
module (the chart's operator watches every namespace).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.cluster.harness import REPO, Cluster, Helm, adopt_into_helm_release
from tests.cluster.operator_fixtures import FlowRuns

from devcluster import appimage, build, node  # isort: skip  (hack/ is on sys.path)

pytestmark = pytest.mark.cluster


CHART = REPO / "charts" / "agentflows"
RELEASE = "agentflows"


def _crictl_image_id(cluster: Cluster, image: str) -> str:
    """The id containerd's CRI gives ``image`` (what a pod's ``imageID`` names)."""
    crictl = build.crictl_binary()
    endpoint = f"--runtime-endpoint=unix://{node.containerd_socket(cluster.cp.state_dir)}"
    done = subprocess.run(
        [str(crictl), endpoint, "inspecti", "-o", "json", image],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    image_id: str = json.loads(done.stdout)["status"]["id"]
    return image_id


@pytest.fixture
def release(control_plane: Cluster) -> Iterator[tuple[str, str]]:
    """(the release's namespace, a runner namespace), both restricted; uninstalled afterwards."""
    suffix = uuid.uuid4().hex[:8]
    system, team = f"af-system-{suffix}", f"team-{suffix}"
    for name in (system, team):
        control_plane.core().create_namespace(
            {
                "metadata": {
                    "name": name,
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                }
            }
        )
    helm = Helm(control_plane)
    try:
        yield system, team
    finally:
        helm("uninstall", RELEASE, "-n", system, "--wait", "--timeout=5m", check=False)
        for name in (system, team):
            control_plane.core().delete_namespace(name)


def test_helm_install_runs_the_operator_from_the_dockerfiles_image_and_a_flowrun_in_a_container(
    control_plane: Cluster, release: tuple[str, str]
) -> None:
    system, team = release
    helm = Helm(control_plane)
    values = ["--set", f"runnerNamespaces={{{team}}}"]
    rendered = helm("template", RELEASE, str(CHART), "-n", system, *values).stdout
    # What kustomize installed for earlier modules (the CRDs, config/rbac) is handed over first.
    documents = [doc for doc in yaml.safe_load_all(rendered) if doc]
    adopt_into_helm_release(control_plane, documents, RELEASE, system)
    helm("install", RELEASE, str(CHART), "-n", system, *values, "--wait", "--timeout=5m")

    image = f"agentflows:{appimage.app_version()}"
    image_id = _crictl_image_id(control_plane, image)
    operators = control_plane.core().list_namespaced_pod(
        system, label_selector="app.kubernetes.io/component=operator"
    )
    assert len(operators.items) == 2  # the chart's default replicas
    # --wait saw the Deployment available: the pods' probes passed through the bridge
    assert any(p.status.container_statuses[0].ready for p in operators.items)
    for pod in operators.items:
        [container] = pod.status.container_statuses
        assert container.container_id.startswith("containerd://")
        assert container.image_id == image_id, (container.image, container.image_id)

    runs = FlowRuns(control_plane, team)
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "hello"},
            "spec": {
                "nodes": [
                    {"id": "greet", "transform": '={greeting: ("hello " + .run.input.name)}'}
                ],
                "output": "=.nodes.greet.json",
            },
        },
        {
            "kind": "FlowRun",
            "metadata": {"name": "hello-1"},
            "spec": {"flow": "hello", "input": {"name": "chart"}},
        },
    )
    status = runs.wait_phase("hello-1", "Succeeded", "Failed", timeout=300)
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["output"] == {"greeting": "hello chart"}
    [pod] = runs.pods("hello-1")
    # The FlowRun is Succeeded as soon as the runner writes it; the kubelet reports the
    # container as ended a moment later.
    runner = control_plane.wait_for_pod_phase(team, pod.metadata.name, ("Succeeded", "Failed"))
    assert runner.spec.service_account_name == "agentflows-runner"
    [container] = runner.status.container_statuses
    assert container.container_id.startswith("containerd://")
    assert container.image_id == image_id
    assert container.state.terminated.exit_code == 0
