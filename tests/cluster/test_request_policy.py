"""Who may decide a human request, enforced by the API server's admission policy.

Real users (alice in editors, bob in viewers) patch flowruns/status with kubectl exactly as
the README shows; the ValidatingAdmissionPolicy in config/policies/request-decisions.yaml
decides. A runner's pod-bound token is refused too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agentflows.kube import client as kube_client
from agentflows.kube import kubeconfig
from tests.cluster.harness import REPO, Cluster, python_pod, wait_for
from tests.cluster.kube_fixtures import (
    crds,
    create_flowrun,
    get_flowrun,
    kube,
    patch_status,
    unique,
)

pytestmark = pytest.mark.cluster
__all__ = ["crds", "kube"]

POLICY = REPO / "config" / "policies" / "request-decisions.yaml"


@pytest.fixture(scope="module")
def decisions_policy(control_plane: Cluster, crds: list[str]) -> Iterator[str]:
    control_plane.kubectl("apply", "-f", str(POLICY))
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "test-flowrun-deciders"},
            "rules": [
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["flowruns"],
                    "verbs": ["get", "list"],
                },
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["flowruns/status"],
                    "verbs": ["get", "patch"],
                },
                {
                    "apiGroups": ["authentication.k8s.io"],
                    "resources": ["selfsubjectreviews"],
                    "verbs": ["create"],
                },
            ],
        }
    )
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "test-flowrun-deciders"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "test-flowrun-deciders",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"},
            ],
        }
    )
    yield "agentflows-request-decisions"
    # the control plane is shared: later modules test what alice and bob may not do
    control_plane.kubectl(
        "delete", "clusterrolebinding/test-flowrun-deciders", "clusterrole/test-flowrun-deciders"
    )


@pytest.fixture
async def waiting_run(
    kube: kube_client.Client, namespace: str, decisions_policy: str, control_plane: Cluster
) -> AsyncIterator[str]:
    name = unique("run")
    await create_flowrun(kube, namespace, name)
    await patch_status(
        kube,
        namespace,
        name,
        {
            "phase": "Waiting",
            "requests": {
                "review": {
                    "node": "review",
                    "kind": "approval",
                    "message": "ship?",
                    "approvers": {"groups": ["editors"]},
                },
                "open": {"node": "open", "kind": "approval", "message": "anyone?"},
                "legal": {
                    "node": "legal",
                    "kind": "approval",
                    "message": "legal ok?",
                    "approvers": {"users": ["alice"]},
                },
            },
        },
    )

    def policy_active() -> bool:
        # The policy reaches the admission plugin asynchronously: wait until it denies. A
        # server-side dry run, so a probe admitted before the policy is active stores nothing
        # (a stored decision by bob would make every later probe a no-op the policy admits).
        denied = patch(
            control_plane,
            namespace,
            name,
            "bob",
            {"review": {"decision": "approve", "decidedBy": "bob"}},
            "--dry-run=server",
        )
        return "bob is not an approver" in denied.stderr

    wait_for(policy_active, 60, "the decision policy to be enforced")
    yield name


def patch(
    cluster: Cluster, namespace: str, run: str, user: str, requests: dict[str, Any], *extra: str
) -> Any:
    body = json.dumps({"status": {"requests": requests}})
    return cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "flowrun",
        run,
        "--subresource=status",
        "--type=merge",
        "-p",
        body,
        *extra,
        user=user,
        check=False,
    )


async def test_a_listed_approver_approves_with_kubectl(
    control_plane: Cluster, namespace: str, waiting_run: str, kube: kube_client.Client
) -> None:
    done = patch(
        control_plane,
        namespace,
        waiting_run,
        "alice",
        {"review": {"decision": "approve", "decidedBy": "alice"}},
    )
    assert done.returncode == 0, done.stderr
    run = await get_flowrun(kube, namespace, waiting_run)
    assert run["status"]["requests"]["review"]["decision"] == "approve"


def test_a_user_who_is_not_an_approver_is_denied_with_the_policy_message(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    denied = patch(
        control_plane,
        namespace,
        waiting_run,
        "bob",
        {"review": {"decision": "approve", "decidedBy": "bob"}},
    )
    assert denied.returncode != 0
    assert "bob is not an approver of this request" in denied.stderr


def test_a_forged_decided_by_is_denied(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    denied = patch(
        control_plane,
        namespace,
        waiting_run,
        "alice",
        {"review": {"decision": "approve", "decidedBy": "carol"}},
    )
    assert denied.returncode != 0
    assert "decidedBy must be your user name, alice" in denied.stderr


def test_a_decision_cannot_be_changed_once_made(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    assert (
        patch(
            control_plane,
            namespace,
            waiting_run,
            "alice",
            {"review": {"decision": "approve", "decidedBy": "alice"}},
        ).returncode
        == 0
    )
    denied = patch(
        control_plane,
        namespace,
        waiting_run,
        "alice",
        {"review": {"decision": "reject", "decidedBy": "alice"}},
    )
    assert denied.returncode != 0
    assert "was already made and cannot be changed" in denied.stderr


def test_without_approvers_anyone_allowed_to_patch_status_decides(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    done = patch(
        control_plane,
        namespace,
        waiting_run,
        "bob",
        {"open": {"decision": "reject", "decidedBy": "bob", "comment": "no"}},
    )
    assert done.returncode == 0, done.stderr


def test_approvers_cannot_be_rewritten_to_let_someone_in(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    denied = patch(
        control_plane,
        namespace,
        waiting_run,
        "bob",
        {"review": {"approvers": {"groups": ["viewers"]}}},
    )
    assert denied.returncode != 0
    assert "approvers cannot be changed" in denied.stderr


def test_a_decision_must_answer_an_existing_request(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    denied = patch(
        control_plane,
        namespace,
        waiting_run,
        "alice",
        {"made-up": {"node": "x", "kind": "approval", "decision": "approve", "decidedBy": "alice"}},
    )
    assert denied.returncode != 0
    assert "must answer an existing request" in denied.stderr


def test_the_cli_approves_as_the_caller(
    control_plane: Cluster, namespace: str, waiting_run: str
) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agentflows.cli.main import main; main()",
            "approve",
            waiting_run,
            "review",
            "-n",
            namespace,
            "--comment",
            "lgtm",
            "--kubeconfig",
            str(control_plane.kubeconfig("alice")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{waiting_run} review: approve by alice"
    denied = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agentflows.cli.main import main; main()",
            "approve",
            waiting_run,
            "legal",
            "-n",
            namespace,
            "--kubeconfig",
            str(control_plane.kubeconfig("mallory")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # refused by RBAC, or by the policy when another test granted mallory status patches
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower() or "not an approver" in denied.stderr


async def test_a_runner_pod_token_cannot_decide(
    control_plane: Cluster, namespace: str, waiting_run: str, kube: kube_client.Client
) -> None:
    core = control_plane.core()
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "runner"}})
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "runner", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["flowruns/status"],
                    "verbs": ["patch", "get"],
                }
            ],
        }
    )
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "runner", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "runner"},
            "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": namespace}],
        }
    )
    pod_manifest = python_pod(
        "sleeper", "import time; time.sleep(120)", serviceAccountName="runner"
    )
    pod = core.create_namespaced_pod(namespace, pod_manifest)
    token = core.create_namespaced_service_account_token(
        "runner",
        namespace,
        {
            "spec": {
                "audiences": [],
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": "sleeper",
                    "uid": pod.metadata.uid,
                },
            }
        },
    ).status.token
    config = kubeconfig.Config(server=kube.config.server, token=token, ca_file=kube.config.ca_file)
    async with kube_client.Client(config, retry_seconds=5) as as_runner:
        with pytest.raises(kube_client.ApiError) as denied:
            await as_runner.merge_patch(
                kube_client.path_of("flowruns", namespace, waiting_run, sub="status"),
                {
                    "status": {
                        "requests": {
                            "open": {
                                "decision": "approve",
                                "decidedBy": "system:serviceaccount:" + namespace + ":runner",
                            }
                        }
                    }
                },
            )
    assert "a runner cannot decide a request" in denied.value.message
    core.delete_namespaced_pod("sleeper", namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, "pod deleted")
