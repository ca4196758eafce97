"""Pictures of flows: ``agentflows.diagram`` and the ``agentflows graph`` command.

Mermaid output is checked by parsing it back (every node, every edge, branch labels, a
subgraph per map body); DOT is laid out by the real Graphviz ``dot`` and the SVG parsed with
xml.etree to find every label. Hostile text in a Flow must come out as text.
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agentflows import diagram
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.cli import main as cli
from agentflows.diagram import mermaid_text, palette
from tests.support.mermaid import ParsedMermaid

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def flows_in(path: Path) -> dict[str, flow_api.FlowSpec]:
    """Every Flow of a YAML file, by name."""
    return {
        doc["metadata"]["name"]: flow_api.FlowSpec.model_validate(doc["spec"])
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "Flow"
    }


EXAMPLE_FLOWS = sorted(
    (path, name) for path in ROOT.joinpath("examples").rglob("*.yaml") for name in flows_in(path)
)


def expected_edges(spec: flow_api.FlowSpec) -> set[tuple[str, str, str | None]]:
    """The edges a reader of the Flow expects, with the case values of branch nodes."""
    found: dict[tuple[str, str], list[str]] = {}
    pairs = [(e.from_, e.to) for e in spec.edges] or [
        (a.id, b.id) for a, b in zip(spec.nodes, spec.nodes[1:], strict=False) if a.branch is None
    ]
    for pair in pairs:
        found.setdefault(pair, [])
    for node in spec.nodes:
        if node.branch is not None:
            targets = [*node.branch.cases.items(), ("default", node.branch.default)]
            for value, target in targets:
                if target is not None:
                    found.setdefault((node.id, target), []).append(value)
    return {(a, b, " | ".join(labels) or None) for (a, b), labels in found.items()}


@pytest.mark.parametrize(("path", "name"), EXAMPLE_FLOWS, ids=lambda v: str(v))
def test_mermaid_of_each_example_has_every_node_edge_and_branch_label(
    path: Path, name: str
) -> None:
    flows = flows_in(path)
    spec = flows[name]
    parsed = ParsedMermaid(diagram.mermaid(spec, flows=flows))
    for node in spec.nodes:
        key = parsed.key(node.id)
        shown = parsed.labels[key][0] if key in parsed.groups else parsed.labels[key][1]
        assert node.kind in shown
        if node.map is not None:
            assert parsed.groups[key], f"map node {node.id} has no body in its subgraph"
    assert parsed.edge_pairs() == expected_edges(spec)
    assert parsed.other == []


def test_research_example_draws_the_map_body_as_a_subgraph_and_the_route_cases() -> None:
    spec = flows_in(ROOT / "examples" / "research.yaml")["research"]
    parsed = ParsedMermaid(diagram.mermaid(spec))
    research = parsed.key("research")
    assert parsed.labels[research] == ["research · map"]
    (body,) = parsed.groups[research]
    assert parsed.labels[body] == ["each item: agent researcher"]
    assert parsed.labels[parsed.key("plan")] == ["plan", "llm openai/gpt-4o-mini"]
    assert ("route", "publish", "approve") in parsed.edge_pairs()
    assert ("route", "done", "default") in parsed.edge_pairs()
    assert ("plan", "research", None) in parsed.edge_pairs()


def labels_in_svg(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


@pytest.mark.parametrize(("path", "name"), EXAMPLE_FLOWS, ids=lambda v: str(v))
def test_svg_laid_out_by_graphviz_shows_every_node_label(path: Path, name: str) -> None:
    assert shutil.which("dot"), "Graphviz's dot is needed (hack/test installs it)"
    flows = flows_in(path)
    spec = flows[name]
    texts = labels_in_svg(diagram.svg(spec, flows=flows))
    for node in spec.nodes:
        assert any(t == node.id or t.startswith(f"{node.id} · ") for t in texts), node.id
    for node in spec.nodes:
        for value in node.branch.cases if node.branch else {}:
            assert value in texts


#: Under 60 characters, so labels show all of it.
HOSTILE = '"];click n0 "javascript:x";%%{init:{}}%%<script>alert(1)`\\N'


def hostile_flow() -> flow_api.FlowSpec:
    """A flow whose user text tries to break out of labels in Mermaid, DOT and SVG."""
    return flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "pick", "branch": {"value": "=1", "cases": {HOSTILE: "bad"}}},
                {"id": "bad", "llm": {"model": {"name": HOSTILE}, "prompt": "hi"}},
                {
                    "id": "call",
                    "tool": {"http": {"url": "http://127.0.0.1/x"}, "name": 'x" URL="http://e'},
                },
            ],
            "edges": [{"from": "bad", "to": "call"}],
        }
    )


def test_hostile_text_in_a_flow_is_mermaid_text_not_syntax() -> None:
    text = diagram.mermaid(hostile_flow())
    parsed = ParsedMermaid(text)
    assert parsed.other == []
    assert parsed.labels[parsed.key("bad")][1] == f"llm {HOSTILE}"
    assert ("pick", "bad", HOSTILE) in parsed.edge_pairs()
    for word in ("<", ">", "%%", '"javascript', "`"):
        assert word not in text.replace("<br>", "").replace("-->", "")


def test_hostile_text_in_a_flow_is_svg_text_without_links_or_scripts() -> None:
    svg = diagram.svg(hostile_flow())
    root = ET.fromstring(svg)
    tags = {element.tag.split("}")[-1] for element in root.iter()}
    assert not tags & {"a", "script", "foreignObject"}
    for element in root.iter():
        assert not any(
            a.split("}")[-1].lower() in ("href", "url") or a.lower().startswith("on")
            for a in element.attrib
        ), element.attrib
    texts = labels_in_svg(svg)
    assert f"llm {HOSTILE}" in texts
    assert 'tool http x" URL="http://e' in texts


def test_dot_of_a_hostile_flow_keeps_each_label_one_quoted_string() -> None:
    text = diagram.dot(hostile_flow())
    (line,) = [line for line in text.splitlines() if "llm " in line]
    assert line.strip().startswith('n1 [label="bad\\nllm \\"];click')
    assert "\\\\N" in line
    assert "URL=" not in text.replace('URL=\\"', "")


def test_svg_of_graphviz_output_loses_links_and_handlers() -> None:
    crafted = (
        b'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        b'onload="x()"><g><a xlink:href="javascript:x()"><text onclick="y()">kept</text></a>'
        b"<script>z()</script></g></svg>"
    )
    from agentflows.diagram import svg_render

    cleaned = svg_render.inert(crafted)
    assert "kept" in cleaned
    for word in ("href", "javascript", "onload", "onclick", "script", "<a"):
        assert word not in cleaned


def run_status() -> dict[str, Any]:
    """status.nodes of a research run that is half way: plan done, one item running."""
    return {
        "plan": {
            "phase": "Succeeded",
            "startedAt": "2026-01-01T10:00:00.000000Z",
            "finishedAt": "2026-01-01T10:00:01.250000Z",
        },
        "research": {"phase": "Running", "startedAt": "2026-01-01T10:00:01.300000Z"},
        "research[0]": {
            "phase": "Succeeded",
            "startedAt": "2026-01-01T10:00:01.300000Z",
            "finishedAt": "2026-01-01T10:00:04.000000Z",
        },
        "research[1]": {"phase": "Failed", "startedAt": "2026-01-01T10:00:01.300000Z"},
        "research[2]": {"phase": "Running", "startedAt": "2026-01-01T10:00:01.300000Z"},
    }


def test_a_run_colours_each_node_by_its_phase_with_its_duration() -> None:
    spec = flows_in(ROOT / "examples" / "research.yaml")["research"]
    text = diagram.mermaid(spec, run_status())
    parsed = ParsedMermaid(text)
    classes = parsed.classes
    plan = parsed.key("plan")
    assert parsed.labels[plan] == ["plan", "llm openai/gpt-4o-mini", "Succeeded 1.25s"]
    assert classes[plan] == "succeeded"
    assert "classDef succeeded fill:#d4edda,stroke:#2e7d32" in text
    research = parsed.key("research")
    (title,) = parsed.labels[research]
    assert re.fullmatch(r"research · map · Running for \d+h\d+m\d+s", title), title
    assert f"style {research} fill:#cce5ff,stroke:#1565c0" in text
    (body,) = parsed.groups[research]
    assert parsed.labels[body][1] == "3 items: 1 Succeeded, 1 Failed, 1 Running"
    assert classes[body] == "failed"
    review = parsed.key("review")
    assert parsed.labels[review][-1] == "Pending" and classes[review] == "pending"


def test_a_run_colours_dot_nodes_and_accepts_typed_records() -> None:
    spec = flows_in(ROOT / "examples" / "research.yaml")["research"]
    typed = {k: flowrun_api.NodeStatus.model_validate(v) for k, v in run_status().items()}
    text = diagram.dot(spec, typed)
    (plan,) = [line for line in text.splitlines() if 'label="plan' in line]
    assert 'Succeeded 1.25s", fillcolor="#d4edda", color="#2e7d32"' in plan
    assert text == diagram.dot(spec, run_status())


def test_records_of_a_newer_runner_draw_and_unreadable_ones_show_pending() -> None:
    spec = flows_in(ROOT / "examples" / "research.yaml")["research"]
    status = {
        "plan": {**run_status()["plan"], "fieldOfANewerRunner": {"x": 1}},
        "review": {"phase": "Exploded"},
    }
    parsed = ParsedMermaid(diagram.mermaid(spec, status))
    assert parsed.labels[parsed.key("plan")][2] == "Succeeded 1.25s"
    assert parsed.labels[parsed.key("review")][2] == "Pending"
    assert parsed.classes[parsed.key("review")] == "pending"


def test_every_node_phase_has_colours() -> None:
    assert {p.value for p in flowrun_api.NodePhase} | {"Pending"} == set(palette.PHASES)


def test_mermaid_text_escapes_every_character_outside_the_safe_set() -> None:
    assert mermaid_text.text('a"b<c>#%`{') == "a#34;b#60;c#62;#35;#37;#96;#123;"


SUB_FLOWS = """
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: outer}
spec:
  nodes:
    - {id: start, transform: "=[1, 2]"}
    - id: each
      map: {items: "=.nodes.start.json", flow: {name: inner, input: "=.item"}}
    - id: once
      flow: {name: inner, input: "=3"}
    - {id: finish, transform: "=1"}
---
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: inner}
spec:
  nodes:
    - {id: double, transform: "=.run.input * 2"}
    - {id: again, flow: {name: inner, input: "=1"}}
"""


def sub_flows(tmp_path: Path) -> Path:
    path = tmp_path / "flows.yaml"
    path.write_text(SUB_FLOWS)
    return path


def test_sub_flows_are_drawn_inside_their_flow_and_map_nodes_with_item_phases(
    tmp_path: Path,
) -> None:
    flows = flows_in(sub_flows(tmp_path))
    status = {
        "once": {"phase": "Running"},
        "once/double": {"phase": "Succeeded"},
        "each": {"phase": "Succeeded"},
        "each[0]/double": {"phase": "Succeeded"},
        "each[1]/double": {"phase": "Failed"},
    }
    text = diagram.mermaid(flows["outer"], status, flows=flows)
    parsed = ParsedMermaid(text)
    classes = parsed.classes
    each, once = parsed.key("each"), parsed.key("once")
    assert parsed.labels[each] == ["each · map flow inner · Succeeded"]
    assert parsed.labels[once] == ["once · flow inner · Running"]
    in_each = {parsed.labels[k][0]: k for k in parsed.groups[each]}
    in_once = {parsed.labels[k][0]: k for k in parsed.groups[once]}
    assert set(in_each) == set(in_once) == {"double", "again"}
    assert classes[in_each["double"]] == "failed"
    assert classes[in_once["double"]] == "succeeded"
    assert classes[in_once["again"]] == "pending"
    # inner calls itself: drawn once, then as a box that names the call
    assert parsed.labels[in_once["again"]][:2] == ["again", "flow inner"]
    assert ("start", "each", None) in parsed.edge_pairs()
    assert ("double", "again", None) in parsed.edge_pairs()


def test_dot_links_to_a_sub_flow_end_at_its_frame(tmp_path: Path) -> None:
    flows = flows_in(sub_flows(tmp_path))
    text = diagram.dot(flows["outer"], flows=flows)
    clusters = re.findall(r"subgraph (cluster_n\d+)", text)
    assert len(clusters) == 2
    assert len(re.findall(r"lhead=cluster_n\d+", text)) == 2
    assert len(re.findall(r"ltail=cluster_n\d+", text)) == 2
    texts = labels_in_svg(diagram.svg(flows["outer"], flows=flows))
    assert texts.count("double") == 2 and "each · map flow inner" in texts


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args), env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_graph_command_prints_the_mermaid_of_a_flow_file() -> None:
    path = ROOT / "examples" / "research.yaml"
    code, out, err = invoke("graph", str(path))
    assert (code, err) == (0, "")
    assert out == diagram.mermaid(flows_in(path)["research"])
    code, out, _ = invoke("graph", str(path), "-o", "dot")
    assert code == 0 and out.startswith("digraph flow {")
    code, out, _ = invoke("graph", str(path), "-o", "svg")
    assert code == 0 and "research · map" in labels_in_svg(out)


def test_graph_command_picks_a_flow_of_several_and_draws_its_sub_flows(tmp_path: Path) -> None:
    path = tmp_path / "valid.yaml"  # validation refuses the sub-flow that calls itself
    path.write_text(SUB_FLOWS.replace('flow: {name: inner, input: "=1"}', 'transform: "=1"'))
    code, _, err = invoke("graph", str(path))
    assert code == 2
    assert err == ("error: the files hold 2 Flows; choose one with --flow (have: inner, outer)\n")
    code, out, _ = invoke("graph", str(path), "--flow", "outer")
    assert code == 0
    assert len(ParsedMermaid(out).groups) == 2


def test_graph_svg_without_graphviz_exits_2_saying_to_install_it(tmp_path: Path) -> None:
    code, out, err = invoke(
        "graph", str(ROOT / "examples" / "hello.yaml"), "-o", "svg", env={"PATH": str(tmp_path)}
    )
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith("error: -o svg needs Graphviz's dot program")
    assert "install Graphviz" in err


def test_graph_of_a_missing_file_or_an_invalid_flow_exits_2(tmp_path: Path) -> None:
    code, _, err = invoke("graph", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert (
        err == f"error: no such file: {tmp_path / 'nope.yaml'} (graph takes FILE... or one RUN)\n"
    )
    code, _, err = invoke("graph", str(ROOT / "examples" / "agents" / "flow.yaml"))
    assert code == 2
    assert 'spec.nodes[0].agent.name: no Agent "editor"' in err
    assert "give the files of its Agents and sub-flows too" in err
    code, _, err = invoke("graph", str(ROOT / "examples" / "hello.yaml"), "-n", "default")
    assert code == 2 and "is a file; -n" in err


def test_graph_of_a_local_run_shows_where_it_waits(tmp_path: Path) -> None:
    state = str(tmp_path / "runs")
    path = str(ROOT / "examples" / "research.yaml")
    code, _, _ = invoke(
        "run", path, "--dry-run", "--input", "topic=ada", "--name", "r1", "--state-dir", state, "-q"
    )
    assert code == 3  # waits for the review
    code, out, err = invoke("graph", "r1", "--state-dir", state)
    assert (code, err) == (0, "")
    parsed = ParsedMermaid(out)
    classes = parsed.classes
    review = parsed.labels[parsed.key("review")]
    assert review[:2] == ["review", "approval"]
    assert re.fullmatch(r"Waiting for \d+\.\d\ds", review[2]), review
    assert classes[parsed.key("review")] == "waiting"
    assert parsed.labels[parsed.key("plan")][2].startswith("Succeeded ")
    (body,) = parsed.groups[parsed.key("research")]
    assert parsed.labels[body][1].endswith(" Succeeded")
    assert classes[parsed.key("publish")] == "pending"


def test_readme_shows_what_graph_prints_for_the_research_example() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Picture a flow", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```mermaid\n(.*?)```", section, re.S)
    code, out, _ = invoke("graph", str(ROOT / "examples" / "research.yaml"))
    assert code == 0
    assert block == out


def test_a_link_out_of_a_sub_flow_leaves_from_its_last_node_that_nothing_follows() -> None:
    outer = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "call", "flow": {"name": "inner"}}, {"id": "after", "transform": "=1"}]}
    )
    inner = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "first", "transform": "=1"},
                {"id": "last", "transform": "=1"},
                {"id": "middle", "transform": "=1"},
            ],
            "edges": [{"from": "first", "to": "middle"}, {"from": "middle", "to": "last"}],
        }
    )
    text = diagram.dot(outer, flows={"inner": inner})
    keys = dict(re.findall(r'(n\d+) \[label="(\w+)', text))
    (leaving,) = re.findall(r"(n\d+) -> n\d+ \[ltail=", text)
    assert keys[leaving] == "last"


def test_graph_draws_an_agent_spec_flow_as_run_would_import_it() -> None:
    code, out, err = invoke("graph", str(ROOT / "tests" / "data" / "agentspec" / "branching.yaml"))
    assert (code, err) == (0, "")
    parsed = ParsedMermaid(out)
    assert [parsed.labels[k][0] for k in parsed.labels] == [
        "start", "classify", "route", "billing", "engineering"
    ]  # fmt: skip
    assert ("route", "billing", "billing | BILLING") in parsed.edge_pairs()
    assert ("route", "engineering", "default") in parsed.edge_pairs()
