"""Loops as a user runs them locally: examples/review-loop.yaml against a scripted model server.

``agentflows run`` and ``agentflows resume --decision`` run as subprocesses (the installed
console script); the model is the scripted OpenAI-compatible server on loopback, so its log of
requests shows what each draft's prompt held.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.model_server import Reply, ScriptedModelServer

ROOT = Path(__file__).resolve().parents[2]
REVIEW_LOOP = ROOT / "examples" / "review-loop.yaml"
AGENTFLOWS = str(Path(sys.executable).parent / "agentflows")
EXAMPLE_MODEL = "{name: openai/gpt-4o-mini, temperature: 0.3}"


def _agentflows(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTFLOWS, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env=dict(os.environ), check=False,
    )  # fmt: skip


def _example_on(server: ScriptedModelServer, tmp_path: Path) -> Path:
    """The example with its models pointed at the scripted server (nothing else changed)."""
    text = REVIEW_LOOP.read_text()
    assert text.count(EXAMPLE_MODEL) == 2
    scripted = f'{{name: openai/scripted-model, apiBase: "{server.url}", temperature: 0.3}}'
    path = tmp_path / "review-loop.yaml"
    path.write_text(text.replace(EXAMPLE_MODEL, scripted))
    return path


def _prompt(server: ScriptedModelServer, call: int) -> str:
    return str(server.requests[call].messages[-1]["content"])


def test_review_loop_example_revises_with_the_comment_until_approved(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    flow = _example_on(model_server, tmp_path)
    model_server.script(
        Reply.text("Pricing is new."), Reply.text("Pricing is new; free tier stays.")
    )
    run = _agentflows("run", str(flow), "--input", "topic=pricing", "--name", "rl", cwd=tmp_path)
    assert run.returncode == 3, run.stderr
    assert json.loads(run.stdout)["phase"] == "Waiting"
    rejected = _agentflows(
        "resume", "rl", "--decision", "reject", "--comment", "mention the free tier", cwd=tmp_path
    )
    assert rejected.returncode == 3, rejected.stderr
    waiting = json.loads(rejected.stdout)["requests"]
    assert sorted(waiting) == ["review", "review#2"]
    assert waiting["review#2"]["message"].endswith("Pricing is new; free tier stays.")
    approved = _agentflows("resume", "rl", "--request", "review#2", "--decision", "approve",
                           cwd=tmp_path)  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    info = json.loads(approved.stdout)
    assert info["phase"] == "Succeeded"
    assert info["output"] == {
        "text": "Pricing is new; free tier stays.",
        "reviews": [
            {"decision": "reject", "comment": "mention the free tier"},
            {"decision": "approve", "comment": None},
        ],
    }
    assert [r["node"] for r in info["requests"].values()] == ["review", "review#2"]
    assert len(model_server.requests) == 2  # no finished node ran again on either resume
    assert "free tier" not in _prompt(model_server, 0)
    assert "The reviewer said: mention the free tier" in _prompt(model_server, 1)
    assert "Pricing is new." in _prompt(model_server, 1)
    shown = _agentflows("get", "rl", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    ran = re.findall(r"^  Succeeded (\S+)", shown.stdout, re.M)
    assert ran == ["draft", "review", "decide", "revise", "review#2", "decide#2", "publish"]
