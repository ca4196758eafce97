"""A run's trace in a real Jaeger: one trace across a pause and two runner pods.

The pinned ``jaeger`` (v2, ``hack/control-plane build-jaeger``) runs with memory storage, taking
OTLP over HTTP on the node's bridge address. The operator (the chart's Deployment, in a
container) runs with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at it and passes that on to its
runner pods. A Flow asks a
model (the scripted server), waits for an approval, and asks again; the approval is given, a
second pod finishes the run. Jaeger's query API must then hold one trace, whose id is the run's
uid, with the operator's run span at the root, both pods' ``run`` spans under it, node spans
under those, and ``chat`` spans with GenAI attributes under the ``llm`` nodes. A run started by
the webhook receiver with a caller's ``traceparent`` joins the caller's trace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentflows import tracing
from agentflows.triggers import signing
from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import (
    FlowRuns,
    Operator,
    pod_host,
    running_operator,
)
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import Reply, ScriptedModelServer

sys.path.insert(0, str(REPO / "hack"))

from devcluster import build
from devcluster.ports import free_port

pytestmark = pytest.mark.cluster

MODEL = "openai/scripted-model"


class Jaeger:
    """The pinned jaeger on free ports: OTLP/HTTP in on ``host`` (where the operator's and the
    runners' pods reach it), the query API out on loopback."""

    def __init__(self, directory: Path, host: str) -> None:
        self.host = host
        self.otlp_port, self.query_port, self.health_port = (free_port() for _ in range(3))
        config = directory / "jaeger.yaml"
        config.write_text(self.config())
        self.log = directory / "jaeger.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(build.jaeger_binary()), "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def config(self) -> str:
        grpc_port = free_port()
        return json.dumps(
            {
                "service": {
                    "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                    "pipelines": {
                        "traces": {
                            "receivers": ["otlp"],
                            "processors": [],
                            "exporters": ["jaeger_storage_exporter"],
                        }
                    },
                    "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                },
                "extensions": {
                    "jaeger_query": {
                        "storage": {"traces": "memstore"},
                        "http": {"endpoint": f"127.0.0.1:{self.query_port}"},
                        "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                    },
                    "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 10000}}}},
                    "healthcheckv2": {
                        "use_v2": True,
                        "http": {"endpoint": f"127.0.0.1:{self.health_port}"},
                    },
                },
                "receivers": {
                    "otlp": {"protocols": {"http": {"endpoint": f"{self.host}:{self.otlp_port}"}}}
                },
                "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
            }
        )

    @property
    def otlp_url(self) -> str:
        return f"http://{self.host}:{self.otlp_port}"

    def ready(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"jaeger exited {self.process.returncode}:\n{self.log.read_text()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/status", timeout=5
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def trace(self, trace_id: int) -> list[dict[str, Any]]:
        """The spans of one trace, each with its tags as a dict and its service name."""
        url = f"http://127.0.0.1:{self.query_port}/api/traces/{trace_id:032x}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                data = json.load(response)["data"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        spans = []
        for found in data:
            for span in found["spans"]:
                span["tags"] = {tag["key"]: tag["value"] for tag in span["tags"]}
                span["service"] = found["processes"][span["processID"]]["serviceName"]
                span["process"] = {
                    tag["key"]: tag["value"]
                    for tag in found["processes"][span["processID"]]["tags"]
                }
                spans.append(span)
        return spans

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def jaeger(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    started = Jaeger(tmp_path_factory.mktemp("jaeger"), pod_host(control_plane))
    try:
        wait_for(started.ready, 60, "jaeger healthy")
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def operator(
    control_plane: Cluster, jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """The operator as shipped, exporting traces to jaeger (and telling its pods to)."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with running_operator(control_plane, tmp_path_factory.mktemp("operator"), env) as running:
        yield running


def llm(node: str, server: ScriptedModelServer, prompt: str) -> dict[str, Any]:
    model = {"name": MODEL, "apiBase": server.url, "retries": 0, "timeoutSeconds": 20}
    return {"id": node, "llm": {"model": model, "prompt": prompt}}


def spans_named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return sorted(
        (span for span in spans if span["operationName"] == name),
        key=lambda span: span["startTime"],
    )


def parent(span: dict[str, Any]) -> str | None:
    refs = [ref for ref in span["references"] if ref["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def whole_trace(jaeger: Jaeger, trace_id: int, run: str) -> list[dict[str, Any]]:
    """Wait until the trace holds the operator's run span and the second pod's run span."""

    def complete() -> list[dict[str, Any]] | None:
        spans = jaeger.trace(trace_id)
        names = [span["operationName"] for span in spans]
        return spans if f"flowrun {run}" in names and names.count(f"run {run}") == 2 else None

    return wait_for(complete, 60, f"the trace of {run} in jaeger")


def test_a_run_paused_for_an_approval_is_one_trace_across_its_two_pods(
    control_plane: Cluster,
    runs: FlowRuns,
    pod_model_server: ScriptedModelServer,
    jaeger: Jaeger,
) -> None:
    pod_model_server.script(Reply.text("a plan"), Reply.text("done"))
    nodes = [
        llm("plan", pod_model_server, "Plan it"),
        {"id": "review", "approval": {"message": "Go?", "approvers": {"users": ["admin"]}}},
        llm("act", pod_model_server, "Do it"),
    ]
    runs.apply(
        {"kind": "Flow", "metadata": {"name": "traced"}, "spec": {"nodes": nodes}},
        {"kind": "FlowRun", "metadata": {"name": "traced-1"}, "spec": {"flow": "traced"}},
    )
    runs.wait_node("traced-1", "review", "Waiting")
    body = json.dumps(
        {"status": {"requests": {"review": {"decision": "approve", "decidedBy": "admin"}}}}
    )
    control_plane.kubectl("-n", runs.namespace, "patch", "flowrun", "traced-1",
                          "--subresource=status", "--type=merge", "-p", body)  # fmt: skip
    status = runs.wait_phase("traced-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["attempt"] == 2
    uid = runs.run("traced-1")["metadata"]["uid"]

    spans = whole_trace(jaeger, uuid.UUID(uid).int, "traced-1")
    assert {span["traceID"] for span in spans} == {uuid.UUID(uid).hex}
    (root,) = spans_named(spans, "flowrun traced-1")
    assert root["service"] == "agentflows-operator" and parent(root) is None
    assert root["spanID"] == f"{tracing.run_span_id(uid):016x}"
    assert root["tags"]["agentflows.run.phase"] == "Succeeded"
    first, second = spans_named(spans, "run traced-1")
    assert {first["service"], second["service"]} == {"agentflows-runner"}
    assert parent(first) == parent(second) == root["spanID"]
    assert first["processID"] != second["processID"], "two pods, two processes"
    assert (first["tags"]["agentflows.run.phase"], second["tags"]["agentflows.run.phase"]) == (
        "Waiting", "Succeeded",
    )  # fmt: skip
    reviews = spans_named(spans, "node review")
    assert [parent(span) for span in reviews] == [first["spanID"], second["spanID"]]
    (plan,) = spans_named(spans, "node plan")
    (act,) = spans_named(spans, "node act")
    assert (parent(plan), parent(act)) == (first["spanID"], second["spanID"])
    chats = spans_named(spans, f"chat {MODEL}")
    assert [parent(span) for span in chats] == [plan["spanID"], act["spanID"]]
    for chat in chats:
        assert chat["tags"]["gen_ai.operation.name"] == "chat"
        assert chat["tags"]["gen_ai.request.model"] == MODEL
        assert chat["tags"]["gen_ai.response.model"]
        assert chat["tags"]["gen_ai.usage.input_tokens"] > 0
        assert chat["tags"]["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.input.messages" not in chat["tags"], "content only when asked for"


@pytest.fixture(scope="module")
def webhook_port(
    control_plane: Cluster, jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """``agentflows webhook`` on loopback (admin's kubeconfig), exporting traces to jaeger."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("webhook") / "webhook.log"
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    with log_path.open("ab") as log:
        receiver = subprocess.Popen(
            [sys.executable, "-m", "agentflows.cli.main", "webhook", "--host", "127.0.0.1",
             "--port", str(port), "--kubeconfig", str(control_plane.kubeconfig())],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip

    def ready() -> bool:
        if receiver.poll() is not None:
            pytest.fail(f"the webhook receiver exited:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, 60, "the webhook receiver ready")
        yield port
    finally:
        receiver.terminate()
        receiver.wait(timeout=20)


def test_a_webhook_call_with_a_traceparent_puts_the_run_in_the_callers_trace(
    control_plane: Cluster,
    runs: FlowRuns,
    pod_model_server: ScriptedModelServer,
    jaeger: Jaeger,
    webhook_port: int,
) -> None:
    secret = b"s3cret-webhook-key"
    control_plane.kubectl("-n", runs.namespace, "create", "secret", "generic", "hook",
                          f"--from-literal=key={secret.decode()}")  # fmt: skip
    pod_model_server.script(Reply.text("hello"))
    trigger = {"name": "hook", "webhook": {"secret": {"name": "hook", "key": "key"}}}
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "hooked"},
            "spec": {"nodes": [llm("greet", pod_model_server, "Hi")], "triggers": [trigger]},
        }
    )
    caller_trace, caller_span = uuid.uuid4().int, 0x00F067AA0BA902B7
    body = b"{}"
    headers = {
        signing.SIGNATURE_HEADER: signing.signature(secret, body),
        "Content-Type": "application/json",
        "traceparent": tracing.traceparent_of(caller_trace, caller_span),
    }
    url = f"http://127.0.0.1:{webhook_port}/hooks/{runs.namespace}/hooked/hook"

    def delivered() -> dict[str, Any] | None:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return dict(json.load(answer))
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # the receiver has not seen the Flow yet
                return None
            raise

    name = wait_for(delivered, 60, "the webhook delivery accepted")["flowRun"]
    status = runs.wait_phase(name, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    uid = runs.run(name)["metadata"]["uid"]

    def complete() -> list[dict[str, Any]] | None:
        spans = jaeger.trace(caller_trace)
        names = {span["operationName"] for span in spans}
        return spans if {f"flowrun {name}", f"run {name}", "node greet"} <= names else None

    spans = wait_for(complete, 60, "the webhook run in the caller's trace")
    (request_span,) = [s for s in spans if s["operationName"].startswith("POST /hooks/")]
    assert request_span["service"] == "agentflows-webhook"
    assert parent(request_span) == f"{caller_span:016x}"
    (root,) = spans_named(spans, f"flowrun {name}")
    assert parent(root) == request_span["spanID"]
    assert root["spanID"] == f"{tracing.run_span_id(uid):016x}"
    (attempt,) = spans_named(spans, f"run {name}")
    assert parent(attempt) == root["spanID"]
