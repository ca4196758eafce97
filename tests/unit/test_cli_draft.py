"""``agentflows draft``: the builder agent against the scripted model server (real HTTP).

The builder runs in our engine with the live capabilities; litellm calls the scripted server
on loopback, so what the model was sent (the validation problems, the dry run) is read from
the server's recorded requests, and what was saved from the file itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentflows.cli import main as cli
from tests.support.fixtures import model_server  # noqa: F401  (fixture)
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall

AGENTS = """\
apiVersion: agentflows.io/v1alpha1
kind: Agent
metadata: {name: triage}
spec:
  model: {name: openai/gpt-4o-mini}
  systemPrompt: You explain why a pod fails, as JSON {"pod", "cause", "fix"}.
"""

GOOD = """\
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: failing-pods}
spec:
  input:
    type: object
    properties: {namespace: {type: string}}
    required: [namespace]
  nodes:
    - id: explain
      agent: {name: triage, prompt: "Explain each failing pod in {{ .run.input.namespace }}"}
    - id: ask
      approval:
        message: Restart the failing pods?
        approvers: {users: [alice]}
  triggers:
    - name: weekdays
      schedule: {cron: "0 8 * * 1-5", timeZone: Europe/Oslo}
      input: '={namespace: "team-a"}'
  output: "=.nodes.explain.json"
"""

#: Two problems: an Agent that does not exist, and an output that is not jq.
BAD = GOOD.replace("name: triage,", "name: triager,").replace(
    '"=.nodes.explain.json"', '"=.nodes.explain.json | map("'
)
ASSUMED = "- schedule time zone Europe/Oslo\n- approver alice"
BELT = {"validate_flow", "dry_run_flow", "explain_resource", "save_flow"}


#: One turn of the scripted builder: the belt tool it calls and the arguments.
Call = tuple[str, dict[str, Any]]


def _draft(
    server: ScriptedModelServer,
    tmp_path: Path,
    args: Sequence[str],
    calls: Sequence[Call] = (),
    answer: str | None = None,
    agents: str = AGENTS,
    env: Mapping[str, str] | None = None,
) -> Result:
    """``agentflows draft ARGS -f AGENTS``, the builder scripted to make ``calls`` then answer.

    One call a turn; without an ``answer`` the script ends after the calls.
    """
    turns = [Reply.calls(ToolCall(tool, arguments)) for tool, arguments in calls]
    server.script(*turns, *([] if answer is None else [Reply.text(answer)]))
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(agents)
    model = ["--model", "openai/scripted-model", "--api-base", server.url]
    return CliRunner().invoke(
        cli.main,
        ["draft", *args, "-f", str(agents_file), *model],
        env={"OPENAI_API_KEY": API_KEY, "AGENTFLOWS_BUILDER_MODEL": None, **(env or {})},
    )


def _tool_results(body: dict[str, Any]) -> list[Any]:
    return [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def test_draft_feeds_the_problems_back_and_saves_the_fixed_flow_after_its_dry_run(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    saved = tmp_path / "failing-pods.yaml"
    calls = [
        ("validate_flow", {"yaml": BAD}),
        ("explain_resource", {"path": "Flow.spec.nodes.approval"}),
        ("validate_flow", {"yaml": GOOD}),
        ("dry_run_flow", {"yaml": GOOD}),
        ("save_flow", {"yaml": GOOD}),
    ]
    result = _draft(
        model_server,
        tmp_path,
        ["list failing pods, ask me first", "-o", str(saved)],
        calls=calls,
        answer=ASSUMED,
    )

    assert result.exit_code == 0, result.output
    first, second = model_server.requests[0].body, model_server.requests[1].body
    assert {t["function"]["name"] for t in first["tools"]} == BELT
    assert "name: triage" in first["messages"][-1]["content"]  # what exists was read
    problems = _tool_results(second)[0]["problems"]
    assert problems[0].endswith('spec.nodes[0].agent.name: no Agent "triager"')
    assert "spec.output: jq syntax error" in problems[1]
    explained = _tool_results(model_server.requests[2].body)[1]
    assert "approvers" in explained["fields"]
    dry_run = _tool_results(model_server.requests[4].body)[-1]
    assert dry_run["nodes"] == {"explain": "Succeeded", "ask": "Waiting"}
    assert saved.read_text() == GOOD
    assert "```mermaid" in result.stdout and "phase: Waiting" in result.stdout
    assert result.stdout.rstrip().endswith(ASSUMED)
    assert model_server.pending == 0


def test_draft_never_saves_a_draft_that_does_not_validate(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    saved = tmp_path / "out.yaml"
    result = _draft(
        model_server,
        tmp_path,
        ["list failing pods", "-o", str(saved)],
        calls=[("save_flow", {"yaml": BAD})],
        answer="- nothing",
    )

    assert result.exit_code == 1
    refused = model_server.requests[1].body["messages"][-1]["content"]
    assert "not saved: the draft does not validate" in refused and "triager" in refused
    assert not saved.exists()
    assert "without a draft that validates" in result.stderr


def test_draft_without_o_saves_nothing_when_nobody_can_confirm(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    target = tmp_path / "asked.yaml"
    result = _draft(
        model_server,
        tmp_path,
        ["list failing pods"],
        calls=[("save_flow", {"yaml": GOOD, "path": str(target)})],
        answer=ASSUMED,
    )

    assert result.exit_code == 0, result.output
    refused = model_server.requests[1].body["messages"][-1]["content"]
    assert "did not confirm" in refused
    assert not target.exists()
    assert "not saved (give -o FILE" in result.stdout


def test_draft_stops_at_its_iteration_limit(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    result = _draft(
        model_server,
        tmp_path,
        ["list failing pods", "--max-iterations", "2"],
        calls=[("validate_flow", {"yaml": BAD})] * 3,
    )

    assert result.exit_code == 1
    assert "the builder stopped" in result.stderr
    assert len(model_server.requests) <= 3


def test_draft_revise_prints_the_diff_of_the_changed_flow(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    existing = tmp_path / "flow.yaml"
    existing.write_text(GOOD)
    changed = GOOD.replace("users: [alice]", "groups: [sre]")
    result = _draft(
        model_server,
        tmp_path,
        ["let the sre group approve", "--revise", str(existing)],
        calls=[("validate_flow", {"yaml": changed})],
        answer="- group sre",
    )

    assert result.exit_code == 0, result.output
    assert "kind: Flow" in model_server.requests[0].body["messages"][-1]["content"]
    assert "-        approvers: {users: [alice]}" in result.stdout
    assert "+        approvers: {groups: [sre]}" in result.stdout
    assert existing.read_text() == GOOD


@pytest.mark.parametrize("args", [[], ["--suggest", "-o", "x.yaml"]])
def test_draft_bad_usage_exits_2_naming_what_is_valid(args: list[str]) -> None:
    result = CliRunner().invoke(cli.main, ["draft", *args], env={"OPENAI_API_KEY": API_KEY})
    assert result.exit_code == 2
    assert "error:" in result.stderr


def test_draft_without_a_reachable_model_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli.main,
        ["draft", "x", "--model", "openai/gpt-4o-mini"],
        env={"OPENAI_API_KEY": None, "AGENTFLOWS_BUILDER_API_BASE": None},
    )
    assert result.exit_code == 2
    assert "--api-base" in result.stderr


def test_draft_tells_the_builder_the_mcp_tools_names_and_schemas_but_no_secret_value(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    from agentflows.agents import secrets
    from agentflows.api import common
    from tests.support import mcp_servers

    token = "mcp-token-7f3a9c21e5"
    ref = common.SecretKeyRef(secret_key_ref=common.SecretKeySelector(name="mcp-auth", key="t"))
    server = mcp_servers.HttpMcpServer(token=token).start()
    calc = (
        "apiVersion: agentflows.io/v1alpha1\nkind: Agent\nmetadata: {name: calc}\nspec:\n"
        "  model: {name: openai/gpt-4o-mini}\n  tools:\n  - name: calc\n    mcp:\n"
        f"      url: {server.url}\n"
        "      headers: {Authorization: {secretKeyRef: {name: mcp-auth, key: t}}}\n"
    )
    try:
        result = _draft(
            model_server,
            tmp_path,
            ["add numbers"],
            answer="- nothing",
            agents=calc,
            env={secrets.secret_env_name(ref): f"Bearer {token}"},
        )
    finally:
        server.stop()

    assert result.exit_code == 1  # it drafted nothing
    told = model_server.requests[0].body["messages"][-1]["content"]
    assert "calc_add" in told and '"a": {' in told and "calc_whoami" in told
    assert "secretKeyRef" in told and "mcp-auth" in told  # the reference, never the value
    assert token not in json.dumps([r.body for r in model_server.requests])


def test_draft_suggest_prints_every_flow_that_validated_and_saves_none(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    second = GOOD.replace("name: failing-pods", "name: pod-report")
    calls = [
        ("validate_flow", {"yaml": GOOD}),
        ("validate_flow", {"yaml": BAD.replace("failing-pods", "broken")}),
        ("dry_run_flow", {"yaml": second}),
    ]
    answer = "- failing-pods: triage every weekday\n- pod-report: a report"
    result = _draft(model_server, tmp_path, ["--suggest"], calls=calls, answer=answer)

    assert result.exit_code == 0, result.output
    assert "Propose up to three Flows" in model_server.requests[0].body["messages"][-1]["content"]
    assert "# Flow failing-pods: validated" in result.stdout
    assert "# Flow pod-report: validated" in result.stdout
    assert "broken" not in result.stdout
    assert list(tmp_path.iterdir()) == [tmp_path / "agents.yaml"]
