"""Smoke tests of the development control plane and its process kubelet."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.cluster.harness import REPO, Cluster, python_pod, wait_for

pytestmark = pytest.mark.cluster
#: The process kubelet's own tests (``hack/control-plane up --node process``).
NODE = "process"


def _established(cluster: Cluster, name: str) -> bool:
    crd = client.ApiextensionsV1Api(cluster.api()).read_custom_resource_definition(name)
    conditions = crd.status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


# ----- API server, kubectl, CRDs, authorization ---------------------------------------------------


def test_apiserver_reports_the_pinned_kubernetes_version(control_plane: Cluster) -> None:
    info = client.VersionApi(control_plane.api()).get_code()
    assert info.git_version == control_plane.cp.versions["kubernetes"]
    assert info.git_tree_state == "clean"


def test_kubectl_sees_the_ready_process_node(control_plane: Cluster) -> None:
    out = control_plane.kubectl("get", "nodes", "-o", "json").stdout
    nodes = json.loads(out)["items"]
    assert [n["metadata"]["name"] for n in nodes] == [control_plane.cp.node_name]
    # This module says NODE = "process": the session's process kubelet serves it.
    assert control_plane.cp.node == "process"
    assert nodes[0]["status"]["nodeInfo"]["containerRuntimeVersion"] == "process://1"
    ready = [c for c in nodes[0]["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"


def test_project_crds_become_established(control_plane: Cluster) -> None:
    files = sorted((REPO / "crds").glob("*.yaml"))
    assert files, "no CRDs in crds/ (they are generated from agentflows.api)"
    names = []
    for path in files:
        control_plane.kubectl("apply", "--server-side", "-f", str(path))
        documents = yaml.safe_load_all(path.read_text())
        names += [
            d["metadata"]["name"]
            for d in documents
            if d and d["kind"] == "CustomResourceDefinition"
        ]
    assert names, "crds/*.yaml hold no CustomResourceDefinition"
    for name in names:
        wait_for(lambda name=name: _established(control_plane, name), 60, f"{name} Established")


def test_custom_resource_definition_becomes_established_and_serves(
    control_plane: Cluster, namespace: str
) -> None:
    control_plane.apply(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.smoke.agentflows.io"},
            "spec": {
                "group": "smoke.agentflows.io",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {"size": {"type": "integer", "minimum": 1}},
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        }
    )
    wait_for(
        lambda: _established(control_plane, "widgets.smoke.agentflows.io"),
        60,
        "Widget CRD Established",
    )
    objects = client.CustomObjectsApi(control_plane.api())
    body = {
        "apiVersion": "smoke.agentflows.io/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 0},
    }

    def created() -> bool:
        try:
            objects.create_namespaced_custom_object(
                "smoke.agentflows.io", "v1", namespace, "widgets", {**body, "spec": {"size": 3}}
            )
        except client.ApiException as error:
            if error.status == 404:  # discovery not yet refreshed
                return False
            raise
        return True

    wait_for(created, 30, "Widget served")
    with pytest.raises(client.ApiException) as invalid:
        objects.create_namespaced_custom_object(
            "smoke.agentflows.io", "v1", namespace, "widgets", {**body, "metadata": {"name": "x"}}
        )
    assert invalid.value.status == 422


def test_user_without_rbac_is_forbidden_until_granted(
    control_plane: Cluster, namespace: str
) -> None:
    denied = control_plane.kubectl(
        "get", "configmaps", "-n", namespace, user="mallory", check=False
    )
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    control_plane.kubectl(
        "create",
        "rolebinding",
        "editors-edit",
        "-n",
        namespace,
        "--clusterrole=edit",
        "--group=editors",
    )
    wait_for(
        lambda: (
            control_plane.kubectl(
                "auth", "can-i", "create", "configmaps", "-n", namespace, user="alice", check=False
            ).returncode
            == 0
        ),
        30,
        "alice allowed",
    )
    assert (
        control_plane.kubectl(
            "auth", "can-i", "create", "configmaps", "-n", namespace, user="bob", check=False
        ).stdout.strip()
        == "no"
    )
    assert (
        control_plane.kubectl("auth", "whoami", "-o", "json", user="alice").stdout.count("editors")
        == 1
    )


def test_validating_admission_policy_rejects_matching_requests(
    control_plane: Cluster, namespace: str
) -> None:
    policy = f"no-forbidden-{namespace}"
    control_plane.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.data) || !('forbidden' in object.data)",
                        "message": "the key 'forbidden' is not allowed",
                    }
                ],
            },
        }
    )
    control_plane.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    core = control_plane.core()

    def rejected() -> str | None:
        try:
            core.create_namespaced_config_map(
                namespace, {"metadata": {"generateName": "probe-"}, "data": {"forbidden": "x"}}
            )
        except client.ApiException as error:
            return str(error.body) if error.status in (400, 403, 422) else None
        return None

    message = wait_for(rejected, 60, "the policy to take effect", interval=1)
    assert "the key 'forbidden' is not allowed" in message


# ----- the process kubelet ------------------------------------------------------------------------


def test_python_pod_succeeds_and_its_output_is_kept(control_plane: Cluster, namespace: str) -> None:
    control_plane.core().create_namespaced_pod(
        namespace, python_pod("hello", "print('hello from the pod')")
    )
    pod = control_plane.wait_for_pod_phase(namespace, "hello", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert control_plane.log_path(pod, "main").read_text() == "hello from the pod\n"
    assert {c.type: c.status for c in pod.status.conditions}["PodScheduled"] == "True"
    logs = control_plane.kubectl("logs", "-n", namespace, "hello").stdout
    assert logs == "hello from the pod\n"


def test_failing_pod_is_failed_with_its_exit_code(control_plane: Cluster, namespace: str) -> None:
    control_plane.core().create_namespaced_pod(
        namespace, python_pod("boom", "import sys; print('bad'); sys.exit(3)")
    )
    pod = control_plane.wait_for_pod_phase(namespace, "boom", ("Succeeded", "Failed"))
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")


def test_pod_sees_env_and_volumes_from_config_maps_secrets_and_fields(
    control_plane: Cluster, namespace: str
) -> None:
    core = control_plane.core()
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"colour": "blue", "file.txt": "x"}}
    )
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    code = textwrap.dedent("""
        import json, os, pathlib
        root = pathlib.Path(os.environ["AGENTFLOWS_POD_ROOT"])
        print(json.dumps({
            "colour": os.environ["COLOUR"], "token": os.environ["TOKEN"],
            "pod": os.environ["POD"], "ns": os.environ["NS"], "label": os.environ["TEAM"],
            "prefixed": os.environ["CFG_colour"], "expanded": os.environ["GREETING"],
            "mounted": (root / "etc/settings/file.txt").read_text(),
            "secret_file": (root / "etc/creds/token").read_text(),
            "sa_namespace": (root / "var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .read_text(),
        }))
    """)
    manifest = python_pod(
        "env",
        code,
        volumes=[
            {"name": "settings", "configMap": {"name": "settings"}},
            {"name": "creds", "secret": {"secretName": "creds"}},
        ],
        container={
            "env": [
                {
                    "name": "COLOUR",
                    "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "colour"}},
                },
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {
                    "name": "TEAM",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}},
                },
                {"name": "GREETING", "value": "hi $(POD)"},
            ],
            "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
            "volumeMounts": [
                {"name": "settings", "mountPath": "/etc/settings"},
                {"name": "creds", "mountPath": "/etc/creds"},
            ],
        },
    )
    manifest["metadata"]["labels"] = {"team": "agents"}
    core.create_namespaced_pod(namespace, manifest)
    pod = control_plane.wait_for_pod_phase(namespace, "env", ("Succeeded", "Failed"))
    output = control_plane.log_path(pod, "main").read_text()
    assert pod.status.phase == "Succeeded", output
    assert json.loads(output) == {
        "colour": "blue",
        "token": "s3cret",
        "pod": "env",
        "ns": namespace,
        "label": "agents",
        "prefixed": "blue",
        "expanded": "hi env",
        "mounted": "x",
        "secret_file": "s3cret",
        "sa_namespace": namespace,
    }


def test_pod_waits_in_container_creating_until_its_secret_exists(
    control_plane: Cluster, namespace: str
) -> None:
    core = control_plane.core()
    env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "later", "key": "k"}}}]
    manifest = python_pod("patient", "import os; print(os.environ['KEY'])", container={"env": env})
    core.create_namespaced_pod(namespace, manifest)

    def waiting_reason() -> str | None:
        statuses = control_plane.pod(namespace, "patient").status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting.reason if waiting else None

    assert wait_for(waiting_reason, 60, "a waiting container") == "ContainerCreating"
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "later"}, "stringData": {"k": "arrived"}}
    )
    pod = control_plane.wait_for_pod_phase(namespace, "patient", ("Succeeded", "Failed"))
    assert control_plane.log_path(pod, "main").read_text() == "arrived\n"


def test_pod_process_has_only_its_service_account_permissions(
    control_plane: Cluster, namespace: str
) -> None:
    code = textwrap.dedent("""
        import json
        from kubernetes import client, config
        config.load_kube_config()
        core = client.CoreV1Api()
        result = {}
        for kind, call in (("configmaps", core.list_namespaced_config_map),
                           ("secrets", core.list_namespaced_secret)):
            try:
                call(config.list_kube_config_contexts()[1]["context"]["namespace"])
                result[kind] = 200
            except client.ApiException as error:
                result[kind] = error.status
        print(json.dumps(result))
    """)

    def run(name: str) -> dict[str, int]:
        control_plane.core().create_namespaced_pod(namespace, python_pod(name, code))
        pod = control_plane.wait_for_pod_phase(namespace, name, ("Succeeded", "Failed"))
        output = control_plane.log_path(pod, "main").read_text()
        assert pod.status.phase == "Succeeded", output
        return dict(json.loads(output.splitlines()[-1]))

    assert run("before-grant") == {"configmaps": 403, "secrets": 403}
    control_plane.kubectl(
        "create",
        "role",
        "read-configmaps",
        "-n",
        namespace,
        "--verb=get,list",
        "--resource=configmaps",
    )
    control_plane.kubectl(
        "create",
        "rolebinding",
        "read-configmaps",
        "-n",
        namespace,
        "--role=read-configmaps",
        f"--serviceaccount={namespace}:default",
    )
    assert run("after-grant") == {"configmaps": 200, "secrets": 403}


def test_deleting_a_running_pod_stops_its_process(control_plane: Cluster, namespace: str) -> None:
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    control_plane.core().create_namespaced_pod(namespace, python_pod("sleeper", code))
    pod = control_plane.wait_for_pod_phase(namespace, "sleeper", ("Running",))
    log = control_plane.log_path(pod, "main")
    pid = int(wait_for(lambda: log.exists() and log.read_text().strip(), 30, "the pid"))
    control_plane.core().delete_namespaced_pod("sleeper", namespace, grace_period_seconds=5)

    def gone() -> bool:
        try:
            control_plane.pod(namespace, "sleeper")
        except client.ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, 60, "the pod to disappear")
    assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_active_deadline_fails_the_pod_as_deadline_exceeded(
    control_plane: Cluster, namespace: str
) -> None:
    control_plane.core().create_namespaced_pod(
        namespace, python_pod("slow", "import time; time.sleep(600)", activeDeadlineSeconds=3)
    )
    pod = control_plane.wait_for_pod_phase(namespace, "slow", ("Succeeded", "Failed"))
    assert (pod.status.phase, pod.status.reason) == ("Failed", "DeadlineExceeded")


def test_on_failure_pod_restarts_until_it_succeeds(control_plane: Cluster, namespace: str) -> None:
    code = textwrap.dedent("""
        import os, pathlib, sys
        marker = pathlib.Path(os.environ["HOME"]) / "tried"
        if not marker.exists():
            marker.write_text("1")
            sys.exit(1)
    """)
    control_plane.core().create_namespaced_pod(
        namespace, python_pod("retry", code, restartPolicy="OnFailure")
    )
    pod = control_plane.wait_for_pod_phase(namespace, "retry", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].restart_count == 1


# ----- controllers ------------------------------------------------------------------------------


def _job_template(code: str) -> dict[str, object]:
    return {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "python:3.11", "command": ["python", "-c", code]}
            ],
        }
    }


def _job_complete(job: client.V1Job) -> bool:
    return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])


def test_job_completes(control_plane: Cluster, namespace: str) -> None:
    batch = control_plane.batch()
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "once"},
            "spec": {"backoffLimit": 0, "template": _job_template("print('job ran')")},
        },
    )
    wait_for(
        lambda: _job_complete(batch.read_namespaced_job("once", namespace)),
        120,
        "the Job to complete",
    )
    pods = control_plane.core().list_namespaced_pod(namespace, label_selector="job-name=once")
    assert [p.status.phase for p in pods.items] == ["Succeeded"]
    assert control_plane.log_path(pods.items[0], "main").read_text() == "job ran\n"


def test_cron_job_fires_and_its_job_completes(control_plane: Cluster, namespace: str) -> None:
    batch = control_plane.batch()
    batch.create_namespaced_cron_job(
        namespace,
        {
            "metadata": {"name": "every-minute"},
            "spec": {
                "schedule": "* * * * *",
                "concurrencyPolicy": "Forbid",
                "jobTemplate": {
                    "spec": {"backoffLimit": 0, "template": _job_template("print('tick')")}
                },
            },
        },
    )

    def completed_job() -> bool:
        jobs = batch.list_namespaced_job(namespace).items
        return any(_job_complete(j) for j in jobs)

    wait_for(completed_job, 150, "a Job of the CronJob to complete", interval=2)


def test_deleting_an_owner_garbage_collects_its_pod(control_plane: Cluster, namespace: str) -> None:
    core = control_plane.core()
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    manifest = python_pod("owned", "import time; time.sleep(600)")
    manifest["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    ]
    core.create_namespaced_pod(namespace, manifest)
    control_plane.wait_for_pod_phase(namespace, "owned", ("Running",))
    core.delete_namespaced_config_map("owner", namespace)

    def collected() -> bool:
        return not core.list_namespaced_pod(namespace).items

    wait_for(collected, 120, "the owned pod to be garbage-collected", interval=1)
