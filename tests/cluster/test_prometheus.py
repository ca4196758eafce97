"""The real Prometheus scrapes the operator (its pod on the real node) and the webhook receiver.

The pinned ``prometheus`` binary (``hack/control-plane build-prometheus``) scrapes the operator
(job ``agentflows-operator``, at its pod's address) and ``agentflows webhook`` (job
``agentflows-webhook``, a local process on loopback) every second, and evaluates the alerts of
``config/prometheus/prometheus-rule.yaml``.
Two rounds of runs that succeed (an agent priced by litellm's table), fail, and wait for an
approval that is then decided, plus webhook deliveries signed right and wrong; one approval left
waiting; one run that stays Pending in a namespace without the runner's ServiceAccount. Every
query of the Grafana dashboard and every alert expression returns at least one series (no metric
or label is misspelt), and after the second round the rates move (a counter's first sample is
only its baseline).

Alert expressions are queried relaxed, since healthy test traffic must not cross the thresholds:
the trailing threshold comparison (`` > N``) is removed, and ``absent(up{...} == 1)`` becomes
``up{...}``. Dashboard variables are replaced: ``$namespace`` and ``$flow`` by ``.*``,
``$__rate_interval`` by ``1m``, ``$__range`` by ``1h``.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflows.triggers import signing
from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator, python_tool
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer

sys.path.insert(0, str(REPO / "hack"))

from devcluster import build
from devcluster.ports import free_port

pytestmark = pytest.mark.cluster

CONFIG = REPO / "config" / "prometheus"
DASHBOARD_VARIABLES = {
    "$namespace": ".*",
    "$flow": ".*",
    "$__rate_interval": "1m",
    "$__range": "1h",
}
FAIL = "import sys\nsys.exit('the tool gives up')\n"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


class Process:
    """A child process whose output goes to a log file; stopped by its own pid."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"{self.popen.args[0]} exited with {self.popen.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


@pytest.fixture(scope="module")
def webhook_port(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``agentflows webhook`` on loopback, with the admin's kubeconfig."""
    port = free_port()
    directory = tmp_path_factory.mktemp("webhook")
    receiver = Process(
        [
            sys.executable, "-m", "agentflows.cli.main", "webhook", "--host", "127.0.0.1",
            "--port", str(port), "--kubeconfig", str(control_plane.kubeconfig()),
        ],
        directory / "webhook.log",
    )  # fmt: skip

    def ready() -> bool:
        receiver.check_alive()
        return get(f"http://127.0.0.1:{port}/readyz")[0] == 200

    try:
        wait_for(ready, 60, "the webhook receiver ready")
        yield port
    finally:
        receiver.stop()


def rule_groups() -> list[dict[str, Any]]:
    (rule,) = yaml.safe_load_all((CONFIG / "prometheus-rule.yaml").read_text())
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@pytest.fixture(scope="module")
def prometheus(
    operator: Operator, webhook_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Prometheus on loopback scraping both every second; its base URL."""
    binary, _ = build.prometheus_binaries()
    directory = tmp_path_factory.mktemp("prometheus")
    (directory / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(directory / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": [target]}],
            }
            for job, target in (
                ("agentflows-operator", operator.address),
                ("agentflows-webhook", f"127.0.0.1:{webhook_port}"),
            )
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = Process(
        [
            str(binary), f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ],
        directory / "prometheus.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        server.check_alive()
        return get(f"{url}/-/ready")[0] == 200

    try:
        wait_for(ready, 60, "prometheus ready")
        yield url
    finally:
        server.stop()
        print(f"prometheus log: {server.log_path}")


def query(url: str, promql: str) -> list[dict[str, Any]]:
    status, body = get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    answer = json.loads(body or b"{}")
    assert status == 200 and answer.get("status") == "success", (promql, status, body[:500])
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def dashboard_queries() -> dict[str, str]:
    dashboard = json.loads((CONFIG / "agentflows-dashboard.json").read_text())
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in DASHBOARD_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries[f"panel {panel['title']!r} {target['refId']}"] = expr
    return queries


def relaxed(expr: str) -> str:
    """The alert expression without its threshold: what healthy traffic also yields."""
    expr = expr.strip()
    if absent := re.fullmatch(r"absent\((.+) == 1\)", expr, flags=re.S):
        return absent[1]
    return re.sub(r"\s*>\s*[0-9.]+$", "", expr)


def alert_queries() -> dict[str, str]:
    return {
        f"alert {rule['alert']}": relaxed(rule["expr"])
        for group in rule_groups()
        for rule in group["rules"]
    }


def decide(cluster: Cluster, namespace: str, run: str, request: str) -> None:
    decision = {"status": {"requests": {request: {"decision": "approve", "decidedBy": "admin"}}}}
    cluster.kubectl(
        "patch", "flowrun", run, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(decision),
    )  # fmt: skip


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def set_up(control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer) -> None:
    """An Agent priced by litellm's table; Flows that succeed, fail, wait, take webhooks."""
    core = control_plane.core()
    model_key = {"metadata": {"name": "scripted-model"}, "stringData": {"api-key": API_KEY}}
    core.create_namespaced_secret(runs.namespace, model_key)
    hook_key = {
        "metadata": {"name": "hook"},
        "data": {"hmac": base64.b64encode(b"s3cret").decode()},
    }
    core.create_namespaced_secret(runs.namespace, hook_key)
    model = {
        "name": "openai/gpt-4o-mini",
        "apiBase": pod_model_server.url,
        "apiKey": {"secretKeyRef": {"name": "scripted-model", "key": "api-key"}},
        "retries": 0,
    }
    runs.apply(
        {
            "kind": "Agent",
            "metadata": {"name": "greeter"},
            "spec": {"model": model, "systemPrompt": "You greet people."},
        },
        flow("priced", [{"id": "ask", "agent": {"name": "greeter", "prompt": "Greet me"}}]),
        flow("broken", [{"id": "give-up", "tool": python_tool(FAIL, {})}]),
        flow("gate", [{"id": "review", "approval": {"message": "Ship it?"}}]),
        # the Budget gauges (AgentflowsBudgetNearlyUsed); far above what the rounds use
        {"kind": "Budget", "metadata": {"name": "team"}, "spec": {"day": {"costUSD": 100}}},
        flow(
            "hooked",
            [{"id": "echo", "transform": "=.run.input"}],
            triggers=[{"name": "push", "webhook": {"secret": {"name": "hook", "key": "hmac"}}}],
        ),
    )
    wait_for(
        lambda: (runs.condition("agents", "greeter", "Ready") or {}).get("status") == "True",
        60,
        "Agent greeter Ready",
    )


def run_round(
    control_plane: Cluster,
    runs: FlowRuns,
    pod_model_server: ScriptedModelServer,
    webhook_port: int,
    round_: int,
) -> None:
    """A run that succeeds, one that fails, one decided; a good and a bad webhook delivery."""
    pod_model_server.script(Reply.text("Hi, world!"))
    priced, broken, gate = (f"{name}-{round_}" for name in ("priced", "broken", "gate"))
    runs.apply(flowrun(priced, "priced"), flowrun(broken, "broken"), flowrun(gate, "gate"))
    assert runs.wait_phase(priced, "Succeeded", "Failed")["phase"] == "Succeeded"
    assert runs.wait_phase(broken, "Failed", "Succeeded")["phase"] == "Failed"
    assert runs.wait_phase(gate, "Waiting", "Failed")["phase"] == "Waiting"
    decide(control_plane, runs.namespace, gate, "review")
    assert runs.wait_phase(gate, "Succeeded", "Failed")["phase"] == "Succeeded"

    hook = f"http://127.0.0.1:{webhook_port}/hooks/{runs.namespace}/hooked/push"
    body = json.dumps({"ref": "main", "round": round_}).encode()
    good = {signing.SIGNATURE_HEADER: signing.signature(b"s3cret", body)}
    bad = {signing.SIGNATURE_HEADER: signing.signature(b"stale key", body)}
    wait_for(lambda: post(hook, body, good) == 202, 60, "a signed delivery accepted")
    assert post(hook, body, bad) == 401


def stuck_namespace(control_plane: Cluster) -> str:
    """A namespace without the runner's ServiceAccount, with a run that stays Pending."""
    stuck = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.core().create_namespace({"metadata": {"name": stuck}})
    FlowRuns(control_plane, stuck).apply(
        flow("orphan", [{"id": "only", "transform": "=1"}]), flowrun("orphan-1", "orphan")
    )
    return stuck


def flow(name: str, nodes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"kind": "Flow", "metadata": {"name": name}, "spec": {"nodes": nodes, **spec}}


def flowrun(name: str, flow_name: str) -> dict[str, Any]:
    return {"kind": "FlowRun", "metadata": {"name": name}, "spec": {"flow": flow_name}}


def test_every_dashboard_query_and_alert_expression_returns_series_from_real_scrapes(
    control_plane: Cluster,
    runs: FlowRuns,
    pod_model_server: ScriptedModelServer,
    webhook_port: int,
    prometheus: str,
) -> None:
    stuck = stuck_namespace(control_plane)
    try:
        set_up(control_plane, runs, pod_model_server)
        run_round(control_plane, runs, pod_model_server, webhook_port, 1)
        runs.apply(flowrun("gate-left", "gate"))
        assert runs.wait_phase("gate-left", "Waiting", "Failed")["phase"] == "Waiting"
        queries = {**dashboard_queries(), **alert_queries()}
        deadline = time.monotonic() + 120
        while (missing := [n for n, q in queries.items() if not query(prometheus, q)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(2)
        assert missing == []

        # A counter's first sample is its baseline: rates move with the second round.
        run_round(control_plane, runs, pod_model_server, webhook_port, 2)
        moved = {
            "finished runs": "sum(rate(agentflows_run_duration_seconds_count[1m])) > 0",
            "cost": "sum(rate(agentflows_cost_usd_total[1m])) > 0",
            "run p50": "histogram_quantile(0.5, sum by (le) (rate(agentflows_run_duration_seconds_bucket[1m]))) >= 0",
            "signature failures": "sum(rate(agentflows_webhook_signature_failures_total[1m])) > 0",
        }
        wait_for(
            lambda: all(query(prometheus, promql) for promql in moved.values()),
            60,
            "rates of the second round",
        )
        for name, promql in sorted(queries.items()):
            first = query(prometheus, promql)[0]
            print(f"{name}: {first['metric']} = {first['value'][1]}")

        pending = query(prometheus, f'agentflows_runs{{namespace="{stuck}", phase="Pending"}}')
        assert [series["value"][1] for series in pending] == ["1"]
        waiting = query(prometheus, f'agentflows_requests_pending{{namespace="{runs.namespace}"}}')
        assert [(s["metric"]["flow"], s["value"][1]) for s in waiting] == [("gate", "1")]
        every = json.dumps(query(prometheus, '{__name__=~"agentflows_.+"}'))
        assert not re.search(r"(priced|broken|gate|orphan)-(\d|left)", every), "a run name"
    finally:
        control_plane.core().delete_namespace(stuck)


def test_every_alert_rule_evaluates_without_error_on_the_scraped_data(prometheus: str) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        status, body = get(f"{prometheus}/api/v1/rules")
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        return rules if status == 200 and all(r.get("lastEvaluation") for r in rules) else None

    rules = wait_for(evaluated, 60, "every rule evaluated once")
    names = {rule["alert"] for group in rule_groups() for rule in group["rules"]}
    assert {rule["name"] for rule in rules} == names
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
