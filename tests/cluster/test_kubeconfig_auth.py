"""The CLI authenticates as kubectl does: exec plugins, contexts, merged paths, certificate data.

Every command runs as a subprocess, as a user types it, against the dev control plane and the
operator of ``operator_fixtures``. The exec plugin is a small script printing an ExecCredential
with the token of alice, a real static-token user of the dev cluster (hack/README.md), as the
EKS, GKE and AKS helpers print theirs. ``$TMPDIR`` is a fresh directory that must stay empty.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns

pytestmark = pytest.mark.cluster


PLUGIN = """#!{python}
import json, os
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
with open({counter!r}, "a") as runs:
    runs.write("ran\\n")
status = {{"token": {token!r}, "expirationTimestamp": "2099-01-01T00:00:00Z"}}
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""
V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


def static_token(cluster: Cluster, user: str) -> str:
    config = yaml.safe_load(cluster.kubeconfig(user).read_text())
    token: str = config["users"][0]["user"]["token"]
    return token


def exec_user(directory: Path, cluster: Cluster, user: str, api_version: str) -> dict[str, Any]:
    """A kubeconfig user whose credential comes from an exec plugin printing ``user``'s token."""
    script = directory / f"credential-{user}-{api_version.rsplit('/', 1)[1]}"
    script.write_text(
        PLUGIN.format(
            python=sys.executable,
            counter=str(directory / "plugin-runs"),
            token=static_token(cluster, user),
        )
    )
    script.chmod(0o755)
    return {"exec": {"apiVersion": api_version, "command": str(script), "interactiveMode": "Never"}}


def kubeconfig(
    path: Path,
    cluster: Cluster,
    users: dict[str, dict[str, Any]],
    current: str | None,
    *,
    with_cluster: bool = True,
    with_contexts: bool = True,
    cluster_entry: dict[str, Any] | None = None,
) -> Path:
    """A kubeconfig with one context per user (named as the user) on the dev cluster."""
    admin = yaml.safe_load(cluster.kubeconfig().read_text())["clusters"][0]
    entry = {"name": "dev", "cluster": cluster_entry or admin["cluster"]}
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry] if with_cluster else [],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [{"name": name, "context": {"cluster": "dev", "user": name}} for name in users]
        if with_contexts
        else [],
    }
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def grant_alice(cluster: Cluster, namespace: str) -> None:
    """What a user who starts and approves runs needs in ``namespace``."""
    rules = [
        {"apiGroups": ["agentflows.io"], "resources": ["flows"], "verbs": ["get", "list"]},
        {
            "apiGroups": ["agentflows.io"],
            "resources": ["flowruns"],
            "verbs": ["create", "get", "list", "watch"],
        },
        {
            "apiGroups": ["agentflows.io"],
            "resources": ["flowruns/status"],
            "verbs": ["get", "patch"],
        },
    ]
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "run-and-approve", "namespace": namespace},
            "rules": rules,
        }
    )
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "alice-runs", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "run-and-approve",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}
            ],
        }
    )


def agentflows(
    scratch: Path, *args: str, kubeconfig_env: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``agentflows ARGS`` with ``$TMPDIR`` = ``scratch`` and only the given ``$KUBECONFIG``."""
    env = {**os.environ, "TMPDIR": str(scratch), "HOME": str(scratch.parent)}
    env.pop("KUBECONFIG", None)
    if kubeconfig_env is not None:
        env["KUBECONFIG"] = kubeconfig_env
    return subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    directory = tmp_path / "tmpdir"
    directory.mkdir()
    return directory


def test_an_exec_plugin_user_starts_gets_and_approves_a_run_leaving_no_temp_file(
    control_plane: Cluster, runs: FlowRuns, tmp_path: Path, scratch: Path
) -> None:
    grant_alice(control_plane, runs.namespace)
    config = kubeconfig(
        tmp_path / "exec.kubeconfig",
        control_plane,
        {"alice-sso": exec_user(tmp_path, control_plane, "alice", V1)},
        "alice-sso",
    )
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "gate"},
            "spec": {
                "nodes": [
                    {"id": "review", "approval": {"message": "Ship it?"}},
                    {"id": "after", "transform": "={decision: .nodes.review.json.decision}"},
                ],
                "output": "=.nodes.after.json",
            },
        }
    )
    wait_for(
        lambda: (c := runs.condition("flows", "gate", "Ready")) and c["status"] == "True",
        60,
        "Flow gate Ready",
    )
    cluster_args = ("-n", runs.namespace, "--kubeconfig", str(config))

    started = agentflows(scratch, "start", "gate", *cluster_args)
    assert started.returncode == 0, started.stderr
    name = started.stdout.strip()
    assert runs.run(name)["spec"]["flow"] == "gate"
    runs.wait_phase(name, "Waiting", "Failed")

    shown = agentflows(scratch, "get", name, *cluster_args)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"{runs.namespace}/{name}  flow gate  phase Waiting")

    approved = agentflows(scratch, "approve", name, *cluster_args)
    assert (approved.returncode, approved.stdout) == (0, f"{name} review: approve by alice\n")
    status = runs.wait_phase(name, "Succeeded", "Failed")
    assert status["output"] == {"decision": "approve"}
    assert status["requests"]["review"]["decidedBy"] == "alice"

    assert (tmp_path / "plugin-runs").read_text().count("ran") >= 3
    assert sorted(scratch.iterdir()) == []


def test_context_chooses_the_user_and_an_unknown_context_is_named(
    control_plane: Cluster, runs: FlowRuns, tmp_path: Path, scratch: Path
) -> None:
    grant_alice(control_plane, runs.namespace)
    config = kubeconfig(
        tmp_path / "two.kubeconfig",
        control_plane,
        {
            "bob": {"token": static_token(control_plane, "bob")},
            "alice": exec_user(tmp_path, control_plane, "alice", V1BETA1),
        },
        "bob",
    )
    where = ("-n", runs.namespace, "--kubeconfig", str(config))

    as_bob = agentflows(scratch, "list", *where)
    assert as_bob.returncode == 2
    assert 'User "bob" cannot list resource "flowruns"' in as_bob.stderr

    as_alice = agentflows(scratch, "list", *where, "--context", "alice")
    assert as_alice.returncode == 0, as_alice.stderr
    assert as_alice.stderr == f"No runs in namespace {runs.namespace}.\n"

    unknown = agentflows(scratch, "list", *where, "--context", "carol")
    assert (unknown.returncode, unknown.stderr) == (
        2,
        'error: context "carol" not in kubeconfig (have: bob, alice)\n',
    )
    assert sorted(scratch.iterdir()) == []


def test_every_path_of_kubeconfig_env_is_merged(
    control_plane: Cluster, runs: FlowRuns, tmp_path: Path, scratch: Path
) -> None:
    grant_alice(control_plane, runs.namespace)
    users = {"alice": exec_user(tmp_path, control_plane, "alice", V1)}
    credentials = kubeconfig(
        tmp_path / "credentials", control_plane, users, None, with_contexts=False
    )
    contexts = kubeconfig(tmp_path / "contexts", control_plane, {}, "alice", with_cluster=False)
    doc = yaml.safe_load(contexts.read_text())
    doc["contexts"] = [{"name": "alice", "context": {"cluster": "dev", "user": "alice"}}]
    contexts.write_text(yaml.safe_dump(doc))

    merged = agentflows(
        scratch,
        "list",
        "-n",
        runs.namespace,
        kubeconfig_env=f"{tmp_path / 'absent'}{os.pathsep}{credentials}{os.pathsep}{contexts}",
    )
    assert merged.returncode == 0, merged.stderr
    assert merged.stderr == f"No runs in namespace {runs.namespace}.\n"

    nothing = agentflows(scratch, "list", "-n", runs.namespace, kubeconfig_env="")
    assert (nothing.returncode, nothing.stderr) == (
        2,
        "error: no kubeconfig: set KUBECONFIG or --kubeconfig\n",
    )


def test_client_certificate_data_authenticates_and_leaves_no_file(
    control_plane: Cluster, runs: FlowRuns, tmp_path: Path, scratch: Path
) -> None:
    ca_cert = control_plane.cp.ca_cert
    key, request, cert = tmp_path / "carol.key", tmp_path / "carol.csr", tmp_path / "carol.crt"
    subject = "/O=system:masters/CN=carol"
    for argv in (
        (
            ("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"),
            ("-keyout", str(key), "-out", str(request), "-subj", subject),
        ),
        (
            ("x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-days", "1"),
            ("-CAkey", str(ca_cert.with_name("ca.key")), "-out", str(cert)),
        ),
    ):
        subprocess.run(["openssl", *argv[0], *argv[1]], check=True, capture_output=True)

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    server = yaml.safe_load(control_plane.kubeconfig().read_text())["clusters"][0]["cluster"]
    config = kubeconfig(
        tmp_path / "cert.kubeconfig",
        control_plane,
        {"carol": {"client-certificate-data": data(cert), "client-key-data": data(key)}},
        "carol",
        cluster_entry={"server": server["server"], "certificate-authority-data": data(ca_cert)},
    )
    runs.apply({"kind": "FlowRun", "metadata": {"name": "listed"}, "spec": {"flow": "absent"}})

    listed = agentflows(
        scratch, "list", "-n", runs.namespace, "--kubeconfig", str(config), "-o", "name"
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == "listed\n"
    assert sorted(scratch.iterdir()) == []
    who = json.loads(
        control_plane.kubectl(
            "--kubeconfig", str(config), "auth", "whoami", "-o", "json", check=True
        ).stdout
    )
    assert who["status"]["userInfo"]["username"] == "carol"
