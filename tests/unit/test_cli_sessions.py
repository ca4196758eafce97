"""``agentflows run`` with a session, then ``agentflows sessions list|show|delete``, as a user would.

The agent talks to the scripted model server; the runs and the sessions commands go through
click's runner in-process with one ``--state-dir``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from agentflows.cli import main as cli
from tests.support.model_server import Reply, ScriptedModelServer


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args), env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _flow_file(tmp_path: Path, server: ScriptedModelServer) -> Path:
    model = server.model_spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    documents = [
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "helper"},
            "spec": {
                "model": model,
                "systemPrompt": "Help.",
                "session": "={{ .run.input.ticket }}",
            },
        },
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Flow",
            "metadata": {"name": "support"},
            "spec": {
                "nodes": [
                    {"id": "answer", "agent": {"name": "helper", "prompt": "{{ .run.input.text }}"}}
                ]
            },
        },
    ]
    path = tmp_path / "support.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


def test_sessions_of_local_runs_are_listed_shown_and_deleted(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    flow = _flow_file(tmp_path, model_server)
    state = str(tmp_path / "state")
    model_server.script(Reply.text("Restart it."), Reply.text("Then reinstall."))
    for text in ("It crashes.", "Still crashes."):
        code, _, err = _invoke(
            "run",
            str(flow),
            "--state-dir",
            state,
            "--input-json",
            json.dumps({"ticket": "T-1", "text": text}),
            env=model_server.env,
        )
        assert code == 0, err
    assert [m["content"] for m in model_server.requests[1].messages][1:3] == [
        "It crashes.",
        "Restart it.",
    ]
    code, out, _ = _invoke("sessions", "list", "--state-dir", state)
    assert code == 0 and out.splitlines()[1].split()[:3] == ["helper", "T-1", "2"]
    code, out, _ = _invoke("sessions", "show", "helper", "T-1", "--state-dir", state)
    assert code == 0 and "user: Still crashes." in out and "assistant: Then reinstall." in out
    code, out, _ = _invoke("sessions", "delete", "helper", "T-1", "--state-dir", state)
    assert code == 0 and "deleted session 'T-1'" in out
    code, _, err = _invoke("sessions", "show", "helper", "T-1", "--state-dir", state)
    assert code == 2 and err.strip() == "error: no session 'T-1' in memory 'helper'"


def test_a_bad_session_expression_on_an_agent_node_is_named_by_its_path(tmp_path: Path) -> None:
    flow = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": "f"},
        "spec": {"nodes": [{"id": "a", "agent": {"name": "x", "prompt": "p", "session": "=.["}}]},
    }
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(flow))
    code, out, _ = _invoke("validate", str(path))
    assert code == 2 and "spec.nodes[0].agent.session" in out


def test_a_bad_session_expression_on_an_agent_is_reported_by_validate(tmp_path: Path) -> None:
    agent = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "helper"},
        "spec": {"model": {"name": "openai/x"}, "session": "=.["},
    }
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(agent))
    code, out, _ = _invoke("validate", str(path))
    assert code == 2 and "spec.session" in out
