"""Pictures of flows with loops: back edges drawn dotted with their bound, runs per iteration."""

from __future__ import annotations

import re
from pathlib import Path

from agentflows import diagram
from agentflows.api import flow as flow_api
from tests.support.mermaid import ParsedMermaid
from tests.unit.test_graph import invoke

ROOT = Path(__file__).resolve().parents[2]
REVIEW_LOOP = ROOT / "examples" / "review-loop.yaml"


def _ids(parsed: ParsedMermaid, pairs: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    return {(parsed.labels[a][0], parsed.labels[b][0]): n for (a, b), n in pairs.items()}


def test_graph_draws_a_loops_back_edge_dotted_with_the_heads_max_iterations() -> None:
    code, out, err = invoke("graph", str(REVIEW_LOOP))
    assert (code, err) == (0, "")
    parsed = ParsedMermaid(out)
    assert _ids(parsed, parsed.back_edges) == {("revise", "review"): 5}
    assert out.count("-.->") == 1
    assert ("revise", "review", None) in parsed.edge_pairs()
    code, dot, _ = invoke("graph", str(REVIEW_LOOP), "-o", "dot")
    dashed = [line.strip() for line in dot.splitlines() if "style=dashed" in line]
    revise, review = parsed.key("revise"), parsed.key("review")
    assert dashed == [f'{revise} -> {review} [label="loop, max 5", style=dashed];']


def test_a_back_edge_out_of_a_branch_keeps_its_case_and_shows_the_flow_default_bound() -> None:
    spec = flow_api.FlowSpec.model_validate(
        {
            "limits": {"maxIterations": 7},
            "nodes": [
                {"id": "draft", "transform": "=1"},
                {"id": "check", "branch": {"value": "=1", "cases": {"1": "done"},
                                           "default": "draft"}},
                {"id": "done", "transform": "=1"},
            ],
        }
    )  # fmt: skip
    parsed = ParsedMermaid(diagram.mermaid(spec))
    assert _ids(parsed, parsed.back_edges) == {("check", "draft"): 7}
    assert parsed.edge_pairs() == {
        ("draft", "check", None),
        ("check", "done", "1"),
        ("check", "draft", "default"),
    }


def test_graph_of_a_local_run_in_its_second_iteration_shows_the_latest_and_its_number(
    tmp_path: Path,
) -> None:
    state = str(tmp_path / "runs")
    code, _, _ = invoke("run", str(REVIEW_LOOP), "--input", "topic=x", "--name", "rl",
                        "--state-dir", state, "-q")  # fmt: skip
    assert code == 3
    code, _, _ = invoke("resume", "rl", "--decision", "reject", "--comment", "more",
                        "--state-dir", state, "-q")  # fmt: skip
    assert code == 3  # waits for review#2
    code, out, err = invoke("graph", "rl", "--state-dir", state)
    assert (code, err) == (0, "")
    parsed = ParsedMermaid(out)
    review = parsed.labels[parsed.key("review")]
    assert review[:2] == ["review", "approval"]
    assert re.fullmatch(r"Waiting for \d+\.\d\ds", review[2]), review
    assert review[3:] == ["iteration 2"]
    assert parsed.classes[parsed.key("review")] == "waiting"
    decide = parsed.labels[parsed.key("decide")]
    assert decide[2].startswith("Succeeded ") and decide[3:] == []
    assert parsed.classes[parsed.key("publish")] == "pending"
