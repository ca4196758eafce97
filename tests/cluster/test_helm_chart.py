"""The per-namespace runner identity of config/rbac, on the real control plane."""

from __future__ import annotations

import os
import subprocess

import pytest
from kubernetes import client

from tests.cluster.harness import REPO, Cluster

pytestmark = pytest.mark.cluster


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
