"""The Helm chart (charts/agentflows) as the built helm binary sees it: lint, render, schema.

Runs the pinned helm from ``hack/devcluster/build.py`` (built from the Go module proxy and cached
next to the control-plane binaries; ``hack/control-plane build-helm``). Every documented values
combination of the chart README lints with ``--strict`` and renders; a typo in values fails with
its path; the rendered RBAC, CRDs and admission policies are those of ``config/`` and ``crds/``.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentflows"
sys.path.insert(0, str(REPO / "hack"))

from devcluster import build  # noqa: E402

#: The combinations the chart README documents, as --set arguments.
COMBINATIONS = {
    "defaults": [],
    "webhook-and-runner-namespaces": ["webhook.enabled=true", "runnerNamespaces={team-a,team-b}"],
    "managed-elsewhere": [
        "crds.install=false",
        "policies.enabled=false",
        "userRoles.enabled=false",
    ],
    "namespaced-operator": ["operator.namespaces={team-a}", "runnerNamespaces={team-a}"],
    "sharded": ["operator.shards=3"],
    "one-replica-without-leader-election": [
        "operator.leaderElection.enabled=false",
        "operator.replicas=1",
    ],
    "tracing": [
        "webhook.enabled=true",
        "tracing.endpoint=http://otel-collector.observability:4318",
        "tracing.env.OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod",
    ],
    "monitoring": [
        "webhook.enabled=true",
        "monitoring.podMonitor.enabled=true",
        "monitoring.podMonitor.labels.release=kube-prometheus-stack",
        "monitoring.rules.enabled=true",
        "monitoring.rules.failedRunRatio=0.5",
        "monitoring.dashboard.enabled=true",
    ],
    "console": ["console.enabled=true", "console.trustProxyFrom=10.0.0.0/24"],
}
#: What a cluster with the Prometheus Operator serves (helm lint cannot be told; template can).
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"


@pytest.fixture(scope="module")
def helm() -> Path:
    return build.helm_binary()


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(helm: Path, *sets: str, api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = [arg for value in sets for arg in ("--set", value)]
    args += [arg for version in api_versions for arg in ("--api-versions", version)]
    done = run_helm(helm, "template", "agentflows", str(CHART), "-n", "agentflows-system", *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(
    documents: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    found = [
        doc
        for doc in documents
        if doc["kind"] == kind
        and doc["metadata"]["name"] == name
        and doc["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} rendered"
    return found[0]


def config_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_every_documented_combination_lints_strictly_and_renders(
    helm: Path, combination: str
) -> None:
    args = [arg for value in COMBINATIONS[combination] for arg in ("--set", value)]
    linted = run_helm(helm, "lint", "--strict", str(CHART), "-n", "agentflows-system", *args)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 chart(s) failed" in linted.stdout
    assert "[WARNING]" not in linted.stdout and "[INFO]" not in linted.stdout, linted.stdout
    kinds = {doc["kind"] for doc in render(helm, *COMBINATIONS[combination])}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds


def test_a_typo_in_values_fails_with_its_path(helm: Path) -> None:
    done = run_helm(helm, "template", str(CHART), "--set", "webhook.enabeld=true")
    assert done.returncode != 0
    assert "at '/webhook': additional properties 'enabeld' not allowed" in done.stderr, done.stderr


def test_a_wrong_type_in_values_fails_with_its_path(helm: Path) -> None:
    done = run_helm(helm, "template", str(CHART), "--set", "runnerNamespaces=team-a")
    assert done.returncode != 0
    assert "at '/runnerNamespaces': got string, want array" in done.stderr, done.stderr


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == package


def test_the_operator_role_grants_exactly_what_config_rbac_grants(helm: Path) -> None:
    rendered = one(render(helm), "ClusterRole", "agentflows-operator")
    (config,) = config_documents(REPO / "config/rbac/role.yaml")
    assert rendered["rules"] == config["rules"]


def test_the_webhook_role_grants_exactly_what_config_webhook_grants(helm: Path) -> None:
    rendered = one(render(helm, "webhook.enabled=true"), "ClusterRole", "agentflows-webhook")
    config = config_documents(REPO / "config/webhook/rbac.yaml")
    (role,) = [doc for doc in config if doc["kind"] == "ClusterRole"]
    assert rendered["rules"] == role["rules"]


def test_each_runner_namespace_gets_the_runner_and_trigger_identities_of_config_rbac(
    helm: Path,
) -> None:
    documents = render(helm, "runnerNamespaces={team-a,team-b}")
    for namespace in ("team-a", "team-b"):
        for component in ("runner", "trigger"):
            name = f"agentflows-{component}"
            one(documents, "ServiceAccount", name, namespace)
            role = one(documents, "Role", name, namespace)
            (config,) = config_documents(REPO / f"config/rbac/{component}/role.yaml")
            assert role["rules"] == config["rules"]
            binding = one(documents, "RoleBinding", name, namespace)
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": name, "namespace": namespace}
            ]


def test_every_policy_of_config_policies_is_rendered_for_the_release_namespace(
    helm: Path,
) -> None:
    documents = render(helm)
    rendered = {
        (doc["kind"], doc["metadata"]["name"])
        for doc in documents
        if doc["kind"].startswith("ValidatingAdmissionPolicy")
    }
    shipped = {
        (doc["kind"], doc["metadata"]["name"])
        for path in (REPO / "config/policies").glob("*.yaml")
        if path.name != "kustomization.yaml"
        for doc in config_documents(path)
    }
    assert shipped and rendered == shipped
    text = yaml.safe_dump_all(render(helm), sort_keys=False)
    assert "system:serviceaccount:agentflows-system:agentflows-operator" in text
    moved = yaml.safe_dump_all(
        [
            doc
            for doc in yaml.safe_load_all(
                run_helm(helm, "template", "x", str(CHART), "-n", "ops").stdout
            )
            if doc
        ]
    )
    assert "system:serviceaccount:agentflows-system:" not in moved
    assert "system:serviceaccount:ops:agentflows-operator" in moved


def test_the_crds_are_those_of_crds_and_are_kept_on_uninstall(helm: Path) -> None:
    documents = render(helm)
    crds = {
        doc["metadata"]["name"]: doc
        for doc in documents
        if doc["kind"] == "CustomResourceDefinition"
    }
    for path in sorted((REPO / "crds").glob("*.yaml")):
        (generated,) = config_documents(path)
        crd = crds.pop(generated["metadata"]["name"])
        assert crd["spec"] == generated["spec"]
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crds == {}
    assert not any(
        doc["kind"] == "CustomResourceDefinition" for doc in render(helm, "crds.install=false")
    )


def test_user_roles_aggregate_into_the_built_in_roles_and_the_approver_decides_only(
    helm: Path,
) -> None:
    documents = render(helm)
    view = one(documents, "ClusterRole", "agentflows-view")
    edit = one(documents, "ClusterRole", "agentflows-edit")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {f"{aggregate}{r}" for r in ("view", "edit", "admin")} <= set(view["metadata"]["labels"])
    assert {f"{aggregate}{r}" for r in ("edit", "admin")} <= set(edit["metadata"]["labels"])
    assert f"{aggregate}view" not in edit["metadata"]["labels"]
    approver = one(documents, "ClusterRole", "agentflows-approver")
    assert approver["rules"] == [
        {"apiGroups": ["agentflows.io"], "resources": ["flowruns"], "verbs": ["get"]},
        {"apiGroups": ["agentflows.io"], "resources": ["flowruns/status"], "verbs": ["patch"]},
    ]


def test_the_operator_pod_meets_the_restricted_pod_security_standard(helm: Path) -> None:
    deployment = one(render(helm), "Deployment", "agentflows-operator", "agentflows-system")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["resources"]["limits"]["memory"]


def test_two_operator_replicas_elect_a_leader_on_a_lease_of_the_release_namespace_only(
    helm: Path,
) -> None:
    documents = render(helm)
    deployment = one(documents, "Deployment", "agentflows-operator", "agentflows-system")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--leader-election-namespace=agentflows-system" in container["command"]
    pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert pod_name in container["env"]
    role = one(documents, "Role", "agentflows-operator-leader-election", "agentflows-system")
    (config_role,) = config_documents(REPO / "config/rbac/leader_election_role.yaml")
    assert role["rules"] == config_role["rules"]
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    binding = one(
        documents, "RoleBinding", "agentflows-operator-leader-election", "agentflows-system"
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentflows-operator", "namespace": "agentflows-system"}
    ]
    cluster_rules = [
        rule for doc in documents if doc["kind"] == "ClusterRole" for rule in doc["rules"]
    ]
    assert not [rule for rule in cluster_rules if "leases" in rule.get("resources", [])]


def test_each_shard_is_a_deployment_of_its_own_with_its_index(helm: Path) -> None:
    deployments = [doc for doc in render(helm, "operator.shards=3") if doc["kind"] == "Deployment"]
    assert [doc["metadata"]["name"] for doc in deployments] == [
        f"agentflows-operator-shard-{index}" for index in range(3)
    ]
    for index, deployment in enumerate(deployments):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {f"--shard-index={index}", "--shard-count=3"} <= set(container["command"])
        assert deployment["spec"]["selector"]["matchLabels"]["agentflows.io/shard"] == str(index)
        assert deployment["spec"]["replicas"] == 2


def test_replicas_without_leader_election_are_refused_and_one_replica_works_alone(
    helm: Path,
) -> None:
    done = run_helm(helm, "template", str(CHART), "--set", "operator.leaderElection.enabled=false")
    assert done.returncode != 0
    assert "operator.replicas: more than 1 needs operator.leaderElection.enabled=true" in (
        done.stderr
    )
    documents = render(helm, "operator.leaderElection.enabled=false", "operator.replicas=1")
    deployment = one(documents, "Deployment", "agentflows-operator", "agentflows-system")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert (
        "--leader-elect=false" in deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    )
    assert not [doc for doc in documents if doc["kind"] == "Role"]


def test_monitors_and_rules_render_only_where_the_prometheus_operator_is_served(
    helm: Path,
) -> None:
    monitoring = COMBINATIONS["monitoring"]
    without = {doc["kind"] for doc in render(helm, *monitoring)}
    assert not without & {"PodMonitor", "PrometheusRule"}
    documents = render(helm, *monitoring, api_versions=(PROMETHEUS_OPERATOR,))
    operator = one(documents, "PodMonitor", "agentflows-operator", "agentflows-system")
    webhook = one(documents, "PodMonitor", "agentflows-webhook", "agentflows-system")
    for monitor, port in ((operator, "metrics"), (webhook, "http")):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == (port, "/metrics")
    deployment = one(documents, "Deployment", "agentflows-operator", "agentflows-system")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert operator["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    rule = one(documents, "PrometheusRule", "agentflows", "agentflows-system")
    ratio = rule["spec"]["groups"][0]["rules"][0]
    assert ratio["alert"] == "AgentflowsRunFailureRatioHigh"
    assert ratio["expr"].rstrip().endswith("> 0.5")
    plain = render(helm, "monitoring.podMonitor.enabled=true", api_versions=(PROMETHEUS_OPERATOR,))
    assert [d["metadata"]["name"] for d in plain if d["kind"] == "PodMonitor"] == [
        "agentflows-operator"
    ]


def test_the_dashboard_configmap_is_the_file_of_config_prometheus_for_the_sidecar(
    helm: Path,
) -> None:
    assert not [d for d in render(helm) if d["metadata"]["name"] == "agentflows-dashboard"]
    documents = render(
        helm, "monitoring.dashboard.enabled=true", "monitoring.dashboard.namespace=grafana"
    )
    dashboard = one(documents, "ConfigMap", "agentflows-dashboard", "grafana")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = REPO / "config" / "prometheus" / "agentflows-dashboard.json"
    assert dashboard["data"]["agentflows-dashboard.json"] == shipped.read_text().rstrip("\n")


def test_a_threshold_that_is_not_a_positive_number_fails_with_its_path(helm: Path) -> None:
    done = run_helm(
        helm, "template", str(CHART), "--set", "monitoring.rules.costBudgetUSDPerDay=lots"
    )
    assert done.returncode != 0
    assert "at '/monitoring/rules/costBudgetUSDPerDay'" in done.stderr, done.stderr


CONSOLE = ("console.enabled=true", "console.trustProxyFrom=10.1.2.3/32")


def test_the_console_account_may_impersonate_and_nothing_else(helm: Path) -> None:
    documents = render(helm, *CONSOLE)
    role = one(documents, "ClusterRole", "agentflows-console")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["users", "groups"],
            "verbs": ["impersonate"],
        }
    ]
    binding = one(documents, "ClusterRoleBinding", "agentflows-console")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentflows-console", "namespace": "agentflows-system"}
    ]
    bound = [
        doc
        for doc in documents
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s.get("name") == "agentflows-console" for s in doc.get("subjects", []))
    ]
    assert bound == [binding]


def test_the_console_may_impersonate_only_the_service_accounts_its_values_allow(
    helm: Path,
) -> None:
    allowed = "console.allowSystemIdentities={system:serviceaccount:ops:auditor,system:masters}"
    documents = render(helm, *CONSOLE, allowed)
    role = one(documents, "ClusterRole", "agentflows-console")
    assert role["rules"][1] == {
        "apiGroups": [""],
        "resources": ["serviceaccounts"],
        "resourceNames": ["auditor"],
        "verbs": ["impersonate"],
    }
    command = one(documents, "Deployment", "agentflows-console", "agentflows-system")["spec"][
        "template"
    ]["spec"]["containers"][0]["command"]
    assert "--allow-system-identity=system:serviceaccount:ops:auditor" in command
    assert "--allow-system-identity=system:masters" in command


def test_the_console_trusts_only_the_configured_proxy_and_runs_restricted(helm: Path) -> None:
    deployment = one(
        render(helm, *CONSOLE), "Deployment", "agentflows-console", "agentflows-system"
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentflows-console"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["command"][:2] == ["agentflows", "console"]
    assert "--trust-proxy-from=10.1.2.3/32" in container["command"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = one(render(helm, *CONSOLE), "Service", "agentflows-console", "agentflows-system")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_console_without_a_trusted_proxy_is_refused_saying_what_to_set(helm: Path) -> None:
    done = run_helm(helm, "template", str(CHART), "--set", "console.enabled=true")
    assert done.returncode != 0
    assert "console.trustProxyFrom: the authenticating proxy's address" in done.stderr


def test_the_console_is_off_by_default(helm: Path) -> None:
    names = {doc["metadata"]["name"] for doc in render(helm)}
    assert "agentflows-console" not in names


def test_a_tracing_endpoint_reaches_the_operator_and_the_webhook_receiver_only_when_set(
    helm: Path,
) -> None:
    def otel_env(documents: list[dict[str, Any]], name: str) -> dict[str, str]:
        (container,) = one(documents, "Deployment", name, "agentflows-system")["spec"]["template"][
            "spec"
        ]["containers"]
        env = container.get("env") or []
        return {e["name"]: e["value"] for e in env if e["name"].startswith("OTEL_")}

    traced = render(helm, *COMBINATIONS["tracing"])
    expected = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod",
    }
    assert otel_env(traced, "agentflows-operator") == expected
    assert otel_env(traced, "agentflows-webhook") == expected
    untraced = render(helm, "webhook.enabled=true")
    assert otel_env(untraced, "agentflows-operator") == {}
    assert otel_env(untraced, "agentflows-webhook") == {}
    bad = run_helm(helm, "template", str(CHART), "--set", "tracing.env.HOME=/x")
    assert "'HOME' does not match pattern '^OTEL_[A-Z0-9_]+$'" in bad.stderr, bad.stderr


def test_the_consoles_webhook_url_is_given_to_it_to_show_trigger_urls_under(helm: Path) -> None:
    hooks = "console.webhookUrl=https://hooks.example.org"
    deployment = one(
        render(helm, *CONSOLE, hooks), "Deployment", "agentflows-console", "agentflows-system"
    )
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--webhook-url=https://hooks.example.org" in command
    sets = [
        arg for value in (*CONSOLE, "console.webhookUrl=hooks here") for arg in ("--set", value)
    ]
    done = run_helm(helm, "template", str(CHART), *sets)
    assert done.returncode != 0 and "webhookUrl" in done.stderr


def test_the_consoles_namespaces_to_look_in_are_each_given_to_it(helm: Path) -> None:
    deployment = one(
        render(helm, *CONSOLE, "console.namespaces={team-a,team-b}"),
        "Deployment",
        "agentflows-console",
        "agentflows-system",
    )
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    given = [arg for arg in command if arg.startswith("--namespace=")]
    assert given == ["--namespace=agentflows-system", "--namespace=team-a", "--namespace=team-b"]
