"""Agent Spec documents whose control flow loops through a BranchingNode: import, run, export."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.model_server import Reply, ScriptedModelServer
from tests.unit.agentspec.conftest import DATA, invoke, output_of, served


def test_a_loop_through_a_branching_node_imports_and_runs_until_it_exits(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served("retry_loop.yaml", tmp_path, model_server)
    model_server.script(Reply.text("AGAIN"), Reply.text("AGAIN"), Reply.text("DONE"))
    state = tmp_path / "runs"
    code, out, err = invoke("run", str(spec), "--state-dir", str(state), "--name", "r1",
                            "--input", "task=count")  # fmt: skip
    assert code == 0, err
    assert output_of(out) == {"answer": "DONE"}
    assert len(model_server.requests) == 3
    nodes = json.loads(out)["nodes"]
    assert [k for k in nodes if k.startswith("ask")] == ["ask", "ask#2", "ask#3"]


def test_a_loop_through_a_branching_node_is_bounded_by_the_flow_default() -> None:
    code, out, err = invoke("import", str(DATA / "retry_loop.yaml"))
    assert code == 0, err
    (flow,) = [d for d in yaml.safe_load_all(out) if d["kind"] == "Flow"]
    assert flow["spec"].get("limits", {}).get("maxIterations", 10) == 10
    code, drawn, err = invoke("graph", str(DATA / "retry_loop.yaml"))
    assert code == 0, err
    assert '-.->|"AGAIN #183; loop, max 10"|' in drawn


def test_export_writes_the_loop_back_as_a_control_flow_edge(tmp_path: Path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text(invoke("import", str(DATA / "retry_loop.yaml"))[1])
    code, exported, err = invoke("export", str(first))
    assert code == 0, err
    document = yaml.safe_load(exported)
    edges = [
        (e["from_node"], e["to_node"], e.get("from_branch"))
        for e in document["control_flow_connections"]
    ]
    refs = document.get("$referenced_components", {})

    def name(ref: dict[str, str]) -> str:
        return str(refs[ref["$component_ref"]]["name"]) if "$component_ref" in ref else ref["name"]

    pairs = {(name(a), name(b)) for a, b, _ in edges}
    assert pairs == {("start", "ask"), ("ask", "check"), ("check", "ask"), ("check", "finish")}
    (tmp_path / "exported.yaml").write_text(exported)
    code, again, err = invoke("import", str(tmp_path / "exported.yaml"))
    assert code == 0, err
    assert again == first.read_text()
