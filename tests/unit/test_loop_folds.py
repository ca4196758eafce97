"""A long loop's folded records (``count#2-20``) on every surface that reads a run's status.

The engine keeps a loop's first iteration and its latest ``ITERATIONS_KEPT`` and folds the ones
between into one record per node (``engine/loops.py``); a run of 30 iterations keeps
``count``, ``count#2-20`` and ``count#21`` ... ``count#30``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as requests_api
from agentflows.controller import metrics as metrics_mod
from tests.support.mermaid import ParsedMermaid
from tests.unit.test_graph import invoke
from tests.unit.test_operator_metrics import series

COUNT = """
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: count-to-30}
spec:
  limits: {maxIterations: 30}
  nodes:
    - {id: count, transform: "=(.nodes.count.json // 0) + 1"}
    - id: check
      branch: {value: "=.nodes.count.json", cases: {"30": done}, default: count}
    - {id: done, transform: "={count: .nodes.count.json, kept: [.iterations.count[].json]}"}
"""


def _run(tmp_path: Path) -> tuple[str, dict[str, object]]:
    flow = tmp_path / "count.yaml"
    flow.write_text(COUNT)
    state = str(tmp_path / "runs")
    code, out, err = invoke("run", str(flow), "--name", "c30", "--state-dir", state, "-q")
    assert code == 0, err
    return state, json.loads(out)


def test_a_local_run_of_30_iterations_keeps_the_first_the_latest_ten_and_one_fold(
    tmp_path: Path,
) -> None:
    _, run = _run(tmp_path)
    assert run["output"] == {"count": 30, "kept": [1, *range(21, 31)]}
    nodes = run["nodes"]
    assert isinstance(nodes, dict)
    counts = [k for k in nodes if flowrun_api.node_of_key(k)[0] == "count"]
    assert sorted(counts, key=flowrun_api.key_order) == [
        "count",
        "count#2-20",
        *(f"count#{n}" for n in range(21, 31)),
    ]
    folded = nodes["count#2-20"]
    assert (folded["phase"], folded["attempts"], folded["output"]["json"]) == ("Succeeded", 19, 20)
    assert folded["detail"] == {"folded": {"succeeded": 19}}


def test_get_shows_a_fold_as_the_iterations_it_holds(tmp_path: Path) -> None:
    state, _ = _run(tmp_path)
    code, out, err = invoke("get", "c30", "--state-dir", state)
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if "count#2-20" in line]
    assert re.fullmatch(r"  Succeeded +count#2-20  19 iterations folded into one record", line)


def test_graph_of_a_run_with_folded_iterations_shows_its_latest_iteration(tmp_path: Path) -> None:
    state, _ = _run(tmp_path)
    code, out, err = invoke("graph", "c30", "--state-dir", state)
    assert (code, err) == (0, "")
    parsed = ParsedMermaid(out)
    assert parsed.labels[parsed.key("count")][-1] == "iteration 30"


def test_an_expired_request_of_a_folded_iteration_is_not_pending() -> None:
    status = flowrun_api.FlowRunStatus.model_validate(
        {
            "nodes": {
                "review": {"phase": "Succeeded"},
                "review#2-20": {"phase": "Succeeded", "detail": {"folded": {"succeeded": 19}}},
                "review#21": {"phase": "Waiting", "detail": {"request": "review#21"}},
            },
            "requests": {
                "review#5": {"node": "review#5", "kind": "approval",
                             "expiresAt": "2026-01-01T00:00:00Z"},
                "review#21": {"node": "review#21", "kind": "approval"},
            },
        }
    )  # fmt: skip
    assert list(requests_api.pending(status)) == ["review#21"]


def test_metrics_count_a_folds_usage_but_not_its_span_as_a_node_duration() -> None:
    status = flowrun_api.FlowRunStatus.model_validate(
        {
            "nodes": {
                "ask": {"phase": "Succeeded", "startedAt": "2026-01-01T00:00:00Z",
                        "finishedAt": "2026-01-01T00:00:01Z",
                        "usage": {"promptTokens": 5}},
                "ask#2-20": {"phase": "Succeeded", "startedAt": "2026-01-01T00:00:01Z",
                             "finishedAt": "2026-01-01T01:00:00Z",
                             "usage": {"promptTokens": 95}},
            },
        }
    )  # fmt: skip
    spec = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "ask", "llm": {"model": {"name": "m"}, "prompt": "p"}}]}
    )
    metrics = metrics_mod.Metrics()
    metrics.run_finished("team-a", "f", "Succeeded", status, spec, {})
    durations = series(metrics, "agentflows_node_duration_seconds_count")
    assert sum(durations.values()) == 1
    tokens = series(metrics, "agentflows_tokens_total")
    assert sum(tokens.values()) == 100
