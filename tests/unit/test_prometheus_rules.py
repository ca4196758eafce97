"""The alerts and the dashboard as Prometheus's own tools see them: promtool check and test rules.

The chart's ``templates/prometheus-rule.yaml`` is the one source of the alerts; the kustomize copy
in ``config/prometheus`` is it rendered with the default values (``hack/control-plane
write-monitoring``). Both pass ``promtool check rules``; the default thresholds fire every alert
on the synthetic series of ``tests/unit/prometheus/alerts_test.yaml`` (``promtool test rules``),
and thresholds set in values reach the expressions. Runs the pinned promtool of
``hack/devcluster/build.py`` (``hack/control-plane build-prometheus``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "prometheus"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "prometheus" / "alerts_test.yaml"
sys.path.insert(0, str(REPO / "hack"))

from devcluster import build, monitoring  # noqa: E402


@pytest.fixture(scope="module")
def helm() -> Path:
    return build.helm_binary()


@pytest.fixture(scope="module")
def promtool() -> Path:
    return build.prometheus_binaries()[1]


def rule_spec(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (rule,) = [doc for doc in documents if doc["kind"] == "PrometheusRule"]
    spec: dict[str, Any] = rule["spec"]
    return spec


def kustomize_spec() -> dict[str, Any]:
    return rule_spec(list(yaml.safe_load_all((CONFIG / "prometheus-rule.yaml").read_text())))


def alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


def run_promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def rules_file(spec: dict[str, Any], directory: Path) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": spec["groups"]}, sort_keys=False))
    return path


@pytest.mark.parametrize("source", ["chart", "kustomize"])
def test_the_rules_pass_promtool_check(
    helm: Path, promtool: Path, tmp_path: Path, source: str
) -> None:
    spec = rule_spec(monitoring.render_chart(helm)) if source == "chart" else kustomize_spec()
    checked = run_promtool(
        promtool, "check", "rules", str(rules_file(spec, tmp_path)), cwd=tmp_path
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts(spec))} rules found" in checked.stdout, checked.stdout


def test_the_kustomize_copy_is_the_chart_rendered_with_default_values(helm: Path) -> None:
    for name, text in monitoring.kustomize_files(helm).items():
        assert (CONFIG / name).read_text() == text, (
            f"config/prometheus/{name} is stale: run hack/control-plane write-monitoring"
        )


def test_the_synthetic_series_fire_every_alert_with_its_text(
    promtool: Path, tmp_path: Path
) -> None:
    rules_file(kustomize_spec(), tmp_path)
    shutil.copy(PROMTOOL_TESTS, tmp_path / "alerts_test.yaml")
    tested = run_promtool(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout, tested.stdout
    cases = yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check["exp_alerts"]
    }
    assert fired == set(alerts(kustomize_spec()))


def test_a_broken_alert_fails_the_promtool_tests(promtool: Path, tmp_path: Path) -> None:
    spec = kustomize_spec()
    alerts(spec)["AgentflowsRunsStuckPending"]["expr"] = 'agentflows_runs{phase="Pendng"} > 0'
    rules_file(spec, tmp_path)
    shutil.copy(PROMTOOL_TESTS, tmp_path / "alerts_test.yaml")
    tested = run_promtool(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "alertname: AgentflowsRunsStuckPending" in tested.stdout + tested.stderr


def test_every_alert_links_its_runbook_section_and_says_what_happened() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text()
    sections = {
        re.sub(r"[^a-z0-9-]", "", title.strip().lower().replace(" ", "-"))
        for title in re.findall(r"^#+ (.+)$", runbook, flags=re.M)
    }
    for name, rule in alerts(kustomize_spec()).items():
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        anchor = annotations["runbook_url"].split("#", 1)[1]
        assert anchor == name.lower() and anchor in sections, f"{name}: no runbook section"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name


def test_thresholds_set_in_values_reach_the_alert_expressions(helm: Path) -> None:
    spec = rule_spec(
        monitoring.render_chart(
            helm,
            "monitoring.rules.failedRunRatio=0.5",
            "monitoring.rules.pendingMinutes=30",
            "monitoring.rules.requestWaitMinutes=240",
            "monitoring.rules.costBudgetUSDPerDay=500",
            "monitoring.rules.budgetUsedRatio=0.9",
            "monitoring.rules.signatureFailuresPerMinute=20",
            "monitoring.rules.reconcileErrorsPerMinute=3",
            "monitoring.rules.runbookURL=https://wiki.example/agentflows",
        )
    )
    found = alerts(spec)
    assert found["AgentflowsRunFailureRatioHigh"]["expr"].rstrip().endswith("> 0.5")
    assert found["AgentflowsRunsStuckPending"]["expr"].rstrip().endswith("> 1800")
    assert found["AgentflowsApprovalWaitingTooLong"]["expr"].rstrip().endswith("> 14400")
    assert found["AgentflowsCostBudgetBurn"]["expr"].rstrip().endswith("> 500")
    assert found["AgentflowsBudgetNearlyUsed"]["expr"].rstrip().endswith("> 0.9")
    assert found["AgentflowsWebhookSignatureFailures"]["expr"].rstrip().endswith("> 20")
    assert found["AgentflowsReconcileErrors"]["expr"].rstrip().endswith("> 3")
    runbook = found["AgentflowsOperatorDown"]["annotations"]["runbook_url"]
    assert runbook == "https://wiki.example/agentflows#agentflowsoperatordown"


def test_the_dashboard_queries_only_metrics_the_components_export() -> None:
    dashboard = json.loads((CONFIG / "agentflows-dashboard.json").read_text())
    exported = set(re.findall(r'"(agentflows_\w+)"', metric_sources())) | {"up"}
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for query in queries
        for name in re.findall(r"\b(agentflows_\w+|up)\{", query)
        + re.findall(r"\((agentflows_\w+)\[", query)
    }
    assert used and used <= exported, used - exported


def metric_sources() -> str:
    operator = REPO / "operator" / "agentflows"
    return (operator / "controller" / "metrics.py").read_text() + (
        operator / "triggers" / "webhook.py"
    ).read_text()


def test_kustomize_builds_the_monitors_the_rule_and_the_dashboard_configmap() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    documents = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout)}
    assert set(documents) == {
        ("ConfigMap", "agentflows-dashboard"),
        ("PodMonitor", "agentflows-operator"),
        ("PodMonitor", "agentflows-webhook"),
        ("PrometheusRule", "agentflows"),
    }
    dashboard = documents[("ConfigMap", "agentflows-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CONFIG / "agentflows-dashboard.json").read_text()
    assert json.loads(dashboard["data"]["agentflows-dashboard.json"]) == json.loads(shipped)
    assert {d["metadata"]["namespace"] for d in documents.values()} == {"agentflows-system"}
