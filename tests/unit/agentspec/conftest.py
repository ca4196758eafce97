"""Fixtures for the Agent Spec tests: the scripted model server, a loopback endpoint, documents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentflows.cli import main as cli
from tests.support.a2a_server import ScriptedA2AServer
from tests.support.fixtures import endpoint, model_server  # noqa: F401  (fixtures)
from tests.support.model_server import ScriptedModelServer

DATA = Path(__file__).parents[2] / "data" / "agentspec"
#: The model URL written in the documents, replaced by the scripted server's.
DOCUMENT_MODEL_URL = "http://127.0.0.1:8000/v1"


def invoke(*args: str) -> tuple[int, str, str]:
    """Run the CLI; exit code, stdout, stderr."""
    result = CliRunner().invoke(cli.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def served(name: str, tmp_path: Path, server: ScriptedModelServer, **urls: str) -> Path:
    """A copy of a test document whose model is the scripted server (and other URLs replaced)."""
    text = (DATA / name).read_text().replace(DOCUMENT_MODEL_URL, server.url)
    for old, new in urls.items():
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def output_of(stdout: str) -> object:
    """The run output printed by ``run``/``resume`` (JSON)."""
    return json.loads(stdout)["output"]


@pytest.fixture
def a2a_agent() -> Iterator[ScriptedA2AServer]:
    """A scripted A2A agent on 127.0.0.1 (random port)."""
    server = ScriptedA2AServer().start()
    try:
        yield server
    finally:
        server.stop()
