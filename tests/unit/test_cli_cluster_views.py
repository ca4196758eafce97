"""What ``agentflows get``, ``start --wait`` and ``watch`` print of a FlowRun on a cluster.

The commands read the run from the API server (a loopback fake here; the real one in
``tests/cluster/test_cli_cluster.py``): ``get`` shows offloaded outputs read back from their
ConfigMaps, ``watch`` a line per node phase change and one when the run's phase changes.
"""

from __future__ import annotations

import json
from typing import Any

from agentflows.cli import cluster, views
from tests.support.fake_flowrun_api import FakeFlowRunApi


def _run(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "r", "namespace": "team"}, "spec": {"flow": "f"}, "status": status}


async def test_get_shows_offloaded_outputs_read_back_and_the_rest_as_written() -> None:
    status = {
        "phase": "Succeeded",
        "attempt": 1,
        "nodes": {
            "big": {"phase": "Succeeded", "outputRef": "configmap:r-out-big:1", "attempts": 1},
            "small": {"phase": "Succeeded", "output": {"n": 1}},
        },
        "outputRef": "configmap:r-out-run:1",
        "usage": {"promptTokens": 3, "llmCalls": 1},
    }
    fake = FakeFlowRunApi("team", "r", spec={"flow": "f"}, status=status)
    for name, value in (("r-out-big-0", ["long"] * 3), ("r-out-run-0", {"done": True})):
        fake.configmaps[name] = {
            "metadata": {"name": name},
            "data": {"part-0000": json.dumps(value)},
        }
    async with fake.client() as api:
        resolved = await cluster.resolve_outputs(api, "team", _run(status))

    shown = json.loads(views.render_run(_run(status), "json", resolved))
    assert shown["output"] == {"done": True}
    assert shown["nodes"] == {
        "big": {"phase": "Succeeded", "outputRef": "configmap:r-out-big:1", "attempts": 1,
                "output": ["long", "long", "long"]},
        "small": {"phase": "Succeeded", "output": {"n": 1}},
    }  # fmt: skip
    assert shown["usage"] == {"promptTokens": 3, "llmCalls": 1}
    assert (shown["phase"], shown["attempt"]) == ("Succeeded", 1)
    text = views.render_run(_run(status), "wide", resolved)
    assert text.splitlines()[0] == "team/r  flow f  phase Succeeded  attempt 1"
    assert "usage 3+0 tokens $0.0000 1 llm 0 tool calls" in text
    assert 'output: {"done": true}' in text


def test_watch_prints_a_line_per_node_phase_change_and_one_for_the_run() -> None:
    before = {"metadata": {"name": "r"}}
    running = _run({"phase": "Running", "nodes": {"a": {"phase": "Running"}}})
    done = _run(
        {"phase": "Succeeded", "nodes": {"a": {"phase": "Succeeded"}, "b": {"phase": "Skipped"}}}
    )

    assert cluster.node_changes(before, running) == ["  Running   a", "run r Running"]
    assert cluster.node_changes(running, running) == []
    assert cluster.node_changes(running, done) == [
        "  Succeeded a",
        "  Skipped   b",
        "run r Succeeded",
    ]
