"""``agentflows graph RUN -n NS`` against a FlowRun the operator ran on the real control plane.

The picture comes from the run's snapshot ConfigMap: after the Flow is edited, the run is still
drawn as it ran, each node coloured by its phase in ``status.nodes``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns
from tests.cluster.test_cli_cluster import run_cli
from tests.support.mermaid import ParsedMermaid

pytestmark = pytest.mark.cluster


def route_flow(*extra: dict[str, Any]) -> dict[str, Any]:
    """A flow that takes one of two branches by its input, plus ``extra`` nodes at the end."""
    return {
        "kind": "Flow",
        "metadata": {"name": "route"},
        "spec": {
            "nodes": [
                {"id": "greet", "transform": '="hello " + .run.input.name'},
                {
                    "id": "pick",
                    "branch": {
                        "value": "=.run.input.loud",
                        "cases": {"true": "shout"},
                        "default": "keep",
                    },
                },
                {"id": "shout", "transform": "=.nodes.greet.json | ascii_upcase"},
                {"id": "keep", "transform": "=.nodes.greet.json"},
                *extra,
            ],
            "edges": [
                {"from": "greet", "to": "pick"},
                {"from": "pick", "to": "shout", "branch": "true"},
                {"from": "pick", "to": "keep", "branch": "default"},
                *({"from": "shout", "to": node["id"]} for node in extra),
            ],
            "output": "=.nodes.shout.json // .nodes.keep.json",
        },
    }


def test_graph_of_a_flowrun_draws_its_snapshot_with_each_node_phase(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    runs.apply(route_flow())
    wait_for(
        lambda: (c := runs.condition("flows", "route", "Ready")) and c["status"] == "True",
        60,
        "Flow Ready",
    )
    started = run_cli(
        control_plane, runs.namespace, "start", "route", "--name", "route-1",
        "--input", "name=ada", "--input", "loud=true", "--wait",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    status = runs.wait_phase("route-1", "Succeeded")
    # an edit after the run started must not change its picture
    runs.apply(route_flow({"id": "added-later", "transform": "=1"}))

    drawn = run_cli(control_plane, runs.namespace, "graph", "route-1")
    assert drawn.returncode == 0, drawn.stderr
    parsed = ParsedMermaid(drawn.stdout)
    assert parsed.other == []
    assert {lines[0] for lines in parsed.labels.values()} == {"greet", "pick", "shout", "keep"}
    assert ("pick", "shout", "true") in parsed.edge_pairs()
    assert ("pick", "keep", "default") in parsed.edge_pairs()
    for node, record in status["nodes"].items():
        key = parsed.key(node)
        assert parsed.classes[key] == record["phase"].lower()
        assert parsed.labels[key][2].startswith(record["phase"])
    assert (status["nodes"]["shout"]["phase"], parsed.classes[parsed.key("keep")]) == (
        "Succeeded",
        "skipped",
    )
    assert parsed.labels[parsed.key("shout")][2].endswith("s")  # its duration

    svg = run_cli(control_plane, runs.namespace, "graph", "route-1", "-o", "svg")
    assert svg.returncode == 0, svg.stderr
    texts = {"".join(t.itertext()) for t in ET.fromstring(svg.stdout).iter()}
    assert {"greet", "pick", "shout", "keep"} <= texts

    # without its snapshot, the run is drawn from its Flow as it is now, and says so
    control_plane.core().delete_namespaced_config_map("route-1-snapshot", runs.namespace)
    now = run_cli(control_plane, runs.namespace, "graph", "route-1")
    assert now.returncode == 0, now.stderr
    assert now.stderr.startswith("note: no snapshot of run route-1 (ConfigMap ")
    assert now.stderr.endswith("drawing Flow route as it is now\n")
    current = ParsedMermaid(now.stdout)
    assert current.labels[current.key("added-later")] == ["added-later", "transform", "Pending"]
    assert current.classes[current.key("shout")] == "succeeded"

    missing = run_cli(control_plane, runs.namespace, "graph", "no-such-run")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and "no-such-run" in missing.stderr
