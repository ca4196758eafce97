"""A canary Secret never leaks (issue 11): runs that try every path to it, then a search for it.

The namespace holds a Secret with a unique canary value that the Flows reference the way a
Flow author may (an http tool's secret header), so the runner pod really receives it. Each run
then tries one way to get the value out: the jq environment (``$ENV``, ``env``) in a transform,
an output and a template; a python tool printing its environment to its result and stderr; an
http tool whose server (on the node's bridge address) echoes the secret header back in its
response. Whatever becomes of each run, the value (plain or base64) must not appear in any
FlowRun, Event, ConfigMap, runner pod log (``kubectl logs``) or the operator's log.
"""

from __future__ import annotations

import base64
import http.server
import json
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.harness import Cluster
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator, pod_host, python_tool
from tests.support.http_serving import ServedHTTP

pytestmark = pytest.mark.cluster

TERMINAL = ("Succeeded", "Failed", "Cancelled")
PRINT_ENV = """
import json, os, sys
print(json.dumps(dict(os.environ)), file=sys.stderr)
print(json.dumps({"env": dict(os.environ)}))
"""


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the request's headers as JSON."""

    def do_GET(self) -> None:
        body = json.dumps({"headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echo_url(control_plane: Cluster) -> Iterator[str]:
    """An HTTP server that echoes request headers, where the runner pods reach it."""
    host = pod_host(control_plane)
    with ServedHTTP(_Echo, host) as server:
        yield f"{server.origin}/echo"


@pytest.fixture
def canary(control_plane: Cluster, runs: FlowRuns) -> str:
    value = f"canary-{uuid.uuid4().hex}"
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "canary", "namespace": runs.namespace},
            "stringData": {"value": value},
        }
    )
    return value


def echo_node(url: str, node_id: str = "echo") -> dict[str, Any]:
    """An http tool sending the canary as a header to the echo server (which sends it back)."""
    return {
        "id": node_id,
        "tool": {
            "http": {
                "url": url,
                "secretHeaders": {"X-Canary": {"secretKeyRef": {"name": "canary", "key": "value"}}},
                "allowHosts": [urllib.parse.urlsplit(url).hostname],
            },
            "args": {},
        },
    }


def attempts(url: str) -> dict[str, dict[str, Any]]:
    """Flow specs by name, each trying one path to the canary."""
    return {
        "env-transform": {
            "nodes": [{"id": "peek", "transform": "={k: $ENV, e: env}"}, echo_node(url)],
        },
        "env-output": {
            "nodes": [echo_node(url)],
            "output": "=env | tostring",
        },
        "env-template": {
            "nodes": [
                {"id": "peek", "transform": "=1"},
                {
                    "id": "say",
                    "tool": python_tool(
                        "import sys; print(sys.stdin.read())", {"seen": "{{ $ENV | tostring }}"}
                    ),
                },
                echo_node(url),
            ],
        },
        "python-env": {
            "nodes": [{"id": "dump", "tool": python_tool(PRINT_ENV, {})}, echo_node(url)]
        },
        "http-echo": {"nodes": [echo_node(url)], "output": "=.nodes.echo"},
    }


def evidence(cluster: Cluster, runs: FlowRuns, operator: Operator) -> dict[str, str]:
    """Everything a user or an operator could read afterwards, by where it came from."""
    custom = client.CustomObjectsApi(cluster.api())
    core = cluster.core()
    found: dict[str, str] = {}
    listing = custom.list_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "flowruns"
    )
    for run in listing["items"]:
        found[f"FlowRun {run['metadata']['name']}"] = json.dumps(run)
    for plural in ("flows", "agents"):
        for obj in custom.list_namespaced_custom_object(
            "agentflows.io", "v1alpha1", runs.namespace, plural
        )["items"]:
            found[f"{plural} {obj['metadata']['name']} status"] = json.dumps(obj.get("status"))
    for event in core.list_namespaced_event(runs.namespace).items:
        found[f"Event {event.metadata.name}"] = f"{event.reason} {event.message}"
    for config_map in core.list_namespaced_config_map(runs.namespace).items:
        found[f"ConfigMap {config_map.metadata.name}"] = json.dumps(config_map.data)
    for pod in core.list_namespaced_pod(runs.namespace).items:
        name = pod.metadata.name
        logs = cluster.kubectl("logs", "-n", runs.namespace, name, "--all-containers")
        found[f"pod log {name}"] = logs.stdout
    found["operator log"] = operator.log_path.read_text(errors="replace")
    return found


def test_a_canary_secret_never_appears_after_runs_that_try_every_path_to_it(
    control_plane: Cluster,
    runs: FlowRuns,
    operator: Operator,
    canary: str,
    echo_url: str,
) -> None:
    flows = attempts(echo_url)
    for name, spec in flows.items():
        runs.apply({"kind": "Flow", "metadata": {"name": name}, "spec": spec})
        runs.apply({"kind": "FlowRun", "metadata": {"name": name}, "spec": {"flow": name}})
    ended = {name: runs.wait_phase(name, *TERMINAL)["phase"] for name in flows}
    # the echo really carried the secret: the http path was exercised, not skipped
    assert ended["http-echo"] == "Succeeded", runs.status("http-echo")

    found = evidence(control_plane, runs, operator)
    assert any(where.startswith("pod log") for where in found), "no runner log was searched"
    forms = {canary, base64.b64encode(canary.encode()).decode()}
    leaks = [where for where, text in found.items() if any(form in text for form in forms)]
    assert leaks == [], f"the canary appears in: {leaks}"
