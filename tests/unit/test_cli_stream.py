"""``agentflows run --stream`` as a user runs it: the answer on stderr as it comes, same stdout.

The agent talks to the scripted model server over real HTTP (server-sent events when streamed);
``agentflows`` runs as a subprocess, the installed console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.model_server import API_KEY, Reply, ScriptedModelServer

AGENTFLOWS = str(Path(sys.executable).parent / "agentflows")
PIECES = ["Restart ", "the ", "pod, ", "then ", "check ", "its ", "logs."]
#: Fields of the printed run that differ between two runs of the same Flow.
_PER_RUN = {"name", "startTime", "completionTime", "startedAt", "finishedAt", "id", "created"}


def _flow_file(tmp_path: Path, server: ScriptedModelServer) -> Path:
    model = server.model_spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    documents = [
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "helper"},
            "spec": {"model": model, "systemPrompt": "Help."},
        },
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Flow",
            "metadata": {"name": "support"},
            "spec": {"nodes": [{"id": "answer", "agent": {"name": "helper", "prompt": "Help."}}]},
        },
    ]
    path = tmp_path / "support.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


def _run(
    tmp_path: Path, server: ScriptedModelServer, name: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    flow = _flow_file(tmp_path, server)
    args = [AGENTFLOWS, "run", str(flow), "--state-dir", str(tmp_path / "state"), "--name", name]
    return subprocess.run(
        [*args, *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **server.env},
        check=False,
    )


def _same_across_runs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _same_across_runs(v) for k, v in value.items() if k not in _PER_RUN}
    if isinstance(value, list):
        return [_same_across_runs(item) for item in value]
    return value


def test_run_with_stream_prints_the_answer_on_stderr_in_order_and_the_same_json_on_stdout(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    answer = "".join(PIECES)
    model_server.script(Reply.text(answer), Reply.text(answer, pieces=PIECES))
    plain = _run(tmp_path, model_server, "plain")
    streamed = _run(tmp_path, model_server, "streamed", "--stream")
    assert plain.returncode == streamed.returncode == 0, streamed.stderr

    assert [r.body.get("stream") for r in model_server.requests] == [None, True]
    assert answer not in plain.stderr, "stderr is not a terminal: no stream without --stream"
    assert f"answer ▸ {answer}\n" in streamed.stderr
    first, last = json.loads(plain.stdout), json.loads(streamed.stdout)
    assert first["nodes"]["answer"]["output"]["text"] == answer
    assert _same_across_runs(last) == _same_across_runs(first)
    raws = [run["nodes"]["answer"]["output"]["raw"] for run in (first, last)]
    assert list(raws[0]) == list(raws[1]), "the recorded reply reads the same"


def test_a_secret_the_model_streams_in_two_chunks_is_masked_on_stderr(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    pieces = ["The key is ", API_KEY[:9], API_KEY[9:] + "."]
    model_server.script(Reply.text("".join(pieces), pieces=pieces))
    streamed = _run(tmp_path, model_server, "leaky", "--stream")
    assert streamed.returncode == 0, streamed.stderr
    assert "answer ▸ The key is [redacted].\n" in streamed.stderr
    assert API_KEY[:9] not in streamed.stderr and API_KEY[9:] not in streamed.stderr
