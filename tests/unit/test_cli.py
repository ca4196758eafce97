"""The agentflows command as a user runs it: validate, run, resume, crds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentflows.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    [*(ROOT / "examples").glob("*.yaml"), *(p for p in (ROOT / "examples").iterdir() if p.is_dir())]
)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


BAD_FLOW = """
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: bad}
spec:
  nodes:
    - {id: start, transform: "=1"}
    - {id: ask, agent: {name: ghost, prompt: hi}}
    - {id: check, transform: "=.x | "}
    - id: route
      branch: {value: "=.nodes.start.json", cases: {bug: fix}, default: start}
    - {id: start, transform: "=2"}
    - {id: lonely, transform: "=3"}
  edges:
    - {from: start, to: ask}
    - {from: ask, to: check}
    - {from: check, to: route}
"""


def test_validate_explains_every_problem_one_line_each_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_FLOW)
    code, out, _ = invoke("validate", str(path))
    assert code == 2
    lines = out.strip().splitlines()
    where = f"{path}#1 (Flow bad)"
    assert f'{where}: spec.nodes[3].branch.cases.bug: no node "fix"' in lines
    assert f'{where}: spec.nodes[1].agent.name: no Agent "ghost"' in lines
    assert f'{where}: spec.nodes[4].id: duplicate node id "start" (first at spec.nodes[0])' in lines
    assert any(
        line.startswith(f"{where}: spec.nodes[2].transform: jq syntax error") for line in lines
    )
    assert any('node "lonely" is unreachable' in line for line in lines)


def test_validate_reports_malformed_yaml_and_unknown_fields(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("kind: Flow\nspec: {nodes: [\n")
    (tmp_path / "b.yaml").write_text(
        "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: b}\n"
        "spec: {nodes: [{id: a, transform: '=1', colour: red}]}\n"
    )
    code, out, _ = invoke("validate", str(tmp_path))
    assert code == 2
    assert f"{tmp_path / 'a.yaml'}#1: malformed YAML" in out
    assert "spec.nodes[0].colour: unknown field" in out


def test_run_of_an_invalid_flow_runs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_FLOW)
    code, out, _err = invoke("run", str(path), "--state-dir", str(tmp_path / "runs"))
    assert code == 2 and out == ""
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_validates(example: Path) -> None:
    code, out, _ = invoke("validate", str(example))
    assert code == 0, out


INPUTS = {
    "hello": ["--input", "name=Ada"],
    "research": ["--input", "topic=kopf"],
    "onboarding": ["--input", "team=platform"],
    "triage": ["--input", "title=API latency above SLO"],
    "cluster-doctor": ["--input", "pod=web-1", "--input", "namespace=default"],
    "agents": ["--input", "topic=kopf operators"],
    "helpdesk": ["--input", "message=Was invoice 42 paid?"],
    "review-loop": ["--input", "topic=the free tier"],
}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_runs_with_dry_run_to_the_end(example: Path, tmp_path: Path) -> None:
    state = str(tmp_path)
    args = ["run", str(example), "--dry-run", "--state-dir", state, "--name", "r1"]
    code, out, _ = invoke(*args, *INPUTS.get(example.stem, []))
    state_json = json.loads(out)
    while code == 3:
        request = next(iter(r for r in state_json["requests"].values() if not r.get("decision")))
        if request["kind"] == "input":
            data = {"owner": "alice", "slack": "#platform"}
            code, out, _ = invoke("resume", "r1", "--state-dir", state, "--data", json.dumps(data))
        else:
            code, out, _ = invoke("resume", "r1", "--state-dir", state, "--decision", "approve")
        state_json = json.loads(out)
    assert code == 0, state_json
    assert state_json["phase"] == "Succeeded"


def test_research_pauses_for_approval_and_reject_routes_to_done(tmp_path: Path) -> None:
    state = str(tmp_path)
    research = str(ROOT / "examples" / "research.yaml")
    code, out, err = invoke(
        "run", research, "--dry-run", "--state-dir", state, "--name", "r", "--input", "topic=kopf"
    )
    assert code == 3
    waiting = json.loads(out)
    assert waiting["phase"] == "Waiting"
    assert waiting["requests"]["review"]["message"] == "Publish findings on kopf?"
    assert "agentflows resume r --request review" in err
    code, out, _ = invoke(
        "resume",
        "r",
        "--state-dir",
        state,
        "--decision",
        "reject",
        "--comment",
        "not now",
        "--by",
        "carol",
    )
    done = json.loads(out)
    assert code == 0
    assert done["output"] == {"topic": "kopf", "published": False}
    assert done["requests"]["review"]["decidedBy"] == "carol"
    assert done["nodes"]["publish"]["phase"] == "Skipped"
    # research items ran once and were not re-run on resume
    assert all(done["nodes"][f"research[{i}]"]["attempts"] == 1 for i in range(2))


def test_resume_rejects_data_that_does_not_match_the_schema(tmp_path: Path) -> None:
    state = str(tmp_path)
    onboarding = str(ROOT / "examples" / "onboarding.yaml")
    code, _, _ = invoke(
        "run", onboarding, "--dry-run", "--state-dir", state, "--name", "o", "--input", "team=x"
    )
    assert code == 3
    code, _, err = invoke(
        "resume", "o", "--state-dir", state, "--data", '{"owner": "alice", "slack": "general"}'
    )
    assert code == 2
    assert "data['slack'] does not match the request's schema: 'general' does not match '^#'" in err


def test_invalid_input_is_refused_with_the_field_named_and_nothing_runs(tmp_path: Path) -> None:
    code, out, err = invoke(
        "run",
        str(ROOT / "examples" / "hello.yaml"),
        "--state-dir",
        str(tmp_path / "runs"),
        "--input",
        "name=3",
    )
    assert code == 2 and out == ""
    assert "error: input.name: 3 is not of type 'string'" in err
    assert not (tmp_path / "runs").exists()


def test_without_credentials_the_run_uses_the_mock_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, _out, err = invoke(
        "run",
        str(ROOT / "examples" / "triage.yaml"),
        "--state-dir",
        str(tmp_path),
        "--input",
        "title=db down",
    )
    assert code == 0
    assert "using the embedded mock model" in err


def test_crds_prints_every_custom_resource_definition() -> None:
    code, out, _ = invoke("crds")
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    kinds = sorted(d["spec"]["names"]["kind"] for d in docs)
    assert kinds == ["Agent", "AgentSession", "Budget", "Flow", "FlowRun"]


def test_console_script_runs_the_readme_command(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agentflows.cli.main import main; main()",
            "run",
            str(ROOT / "examples" / "triage.yaml"),
            "--input",
            "title=API latency above SLO",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["phase"] == "Succeeded"
    assert "✓ classify (llm) succeeded" in result.stderr


def test_an_unknown_field_does_not_hide_the_graph_problems_behind_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        BAD_FLOW.replace(
            '{id: lonely, transform: "=3"}', '{id: lonely, transform: "=3", colour: red}'
        )
    )
    code, out, _ = invoke("validate", str(path))
    assert code == 2
    assert "spec.nodes[5].colour: unknown field" in out
    assert f'{path}#1 (Flow bad): spec.nodes[3].branch.cases.bug: no node "fix"' in out
