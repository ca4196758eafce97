"""A loop's records (``review``, ``review#2``, ...) read on every surface that shows a run.

The API server returns ``status.nodes`` and ``status.requests`` with their keys sorted as text
(``review#10`` before ``review#2``); each surface must strip the ``#<n>`` to find the node and
show the iterations in turn.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.cli import views
from agentflows.console import run_detail
from agentflows.controller import metrics as metrics_mod
from tests.unit.test_operator_metrics import series

ROOT = Path(__file__).resolve().parents[2]
FLOW = yaml.safe_load((ROOT / "examples" / "review-loop.yaml").read_text())["spec"]
ITERATIONS = 11


def _at(second: int) -> str:
    return f"2026-01-01T10:{second // 60:02d}:{second % 60:02d}.000000Z"


def _run() -> dict[str, Any]:
    """A review-loop run rejected ten times, waiting for review#11, as the API server sends it."""
    nodes: dict[str, Any] = {"draft": {"phase": "Succeeded", "startedAt": _at(0),
                                       "finishedAt": _at(1), "output": {"text": "v1"}}}  # fmt: skip
    requests: dict[str, Any] = {}
    clock = 2
    for n in range(1, ITERATIONS + 1):
        suffix = f"#{n}" if n > 1 else ""
        last = n == ITERATIONS
        nodes[f"review{suffix}"] = {"phase": "Waiting" if last else "Succeeded",
                                    "startedAt": _at(clock), "output": {"json": {"n": n}}}  # fmt: skip
        requests[f"review{suffix}"] = {"kind": "approval", "node": f"review{suffix}",
                                       "message": f"draft {n}"}  # fmt: skip
        if last:
            break
        nodes[f"decide{suffix}"] = {"phase": "Succeeded", "startedAt": _at(clock + 1)}
        nodes[f"revise{suffix}"] = {"phase": "Succeeded", "startedAt": _at(clock + 2),
                                    "output": {"text": f"v{n + 1}"},
                                    "usage": {"promptTokens": 5, "completionTokens": 3}}  # fmt: skip
        clock += 3
    status = {"phase": "Waiting", "nodes": dict(sorted(nodes.items())),
              "requests": dict(sorted(requests.items()))}  # fmt: skip
    return {"metadata": {"name": "rl", "namespace": "team-a"}, "spec": {"flow": "review-loop"},
            "status": status}  # fmt: skip


def _ran() -> list[str]:
    keys = ["draft"]
    for n in range(1, ITERATIONS + 1):
        suffix = f"#{n}" if n > 1 else ""
        keys += [f"review{suffix}", *([f"decide{suffix}", f"revise{suffix}"] * (n < ITERATIONS))]
    return keys


def test_node_of_key_strips_the_iteration_map_item_and_sub_flow_steps() -> None:
    assert flowrun_api.node_of_key("review#12") == ("review", 12)
    assert flowrun_api.node_of_key("research#2[3]/inner#4") == ("research", 2)
    assert flowrun_api.node_of_key("plan") == ("plan", 1)


def test_get_lists_a_loops_iterations_in_the_order_they_ran_not_as_sorted_text() -> None:
    table = views.render_run(_run(), "table")
    shown = [m[1] for m in re.finditer(r"^  (?:Succeeded|Waiting)\s+(\S+)", table, re.M)]
    assert shown == _ran()
    requests = re.findall(r"^  request (\S+) ", table, re.M)
    assert requests == ["review", *(f"review#{n}" for n in range(2, ITERATIONS + 1))]


def test_console_lists_each_iteration_after_its_node_with_the_nodes_definition() -> None:
    run = _run()
    order = run_detail.node_order(run, FLOW)
    assert order[:3] == ["draft", "review", "review#2"]
    assert order.index("review#11") == order.index("review#10") + 1
    assert order.index("decide") > order.index("review#11")
    page = run_detail.nodes(run, FLOW, lambda node: None)
    (section,) = re.findall(
        r'<section class="node" data-node="review#11">.*?</section>', page, re.S
    )
    assert "Publish this announcement?" in section  # the definition of node review
    # iteration 11 read the revision of iteration 10, over the loop's back edge
    assert "output of revise#10 (.nodes.revise)" in section
    assert "v11" in section
    (decide,) = re.findall(r'<section class="node" data-node="decide#3">.*?</section>', page, re.S)
    assert "output of review#3 (.nodes.review)" in decide


def test_metrics_count_every_iteration_under_its_nodes_type_and_model() -> None:
    metrics = metrics_mod.Metrics()
    run = _run()
    status = flowrun_api.FlowRunStatus.model_validate(
        {**run["status"], "phase": "Failed", "requests": {}}
    )
    spec = flow_api.FlowSpec.model_validate(FLOW)
    metrics.run_finished("team-a", "review-loop", "Failed", status, spec, {})
    tokens = series(metrics, "agentflows_tokens_total")
    by_model = {dict(labels)["model"]: value for labels, value in tokens.items()
                if dict(labels)["kind"] == "prompt"}  # fmt: skip
    assert by_model == {"openai/gpt-4o-mini": 5 * (ITERATIONS - 1)}
