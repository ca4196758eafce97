"""Pytest fixtures for the agents layer; wire them in with ``from tests.support.fixtures import *``.

``model_server`` is a :class:`~tests.support.model_server.ScriptedModelServer` on loopback,
started for the test and stopped after it. ``server.model_spec()`` points a ModelSpec at it and
``server.env`` is the environment its apiKey secret resolves from. ``endpoint`` is a
:class:`~tests.support.endpoint.LoopbackEndpoint` for the http tool, and ``ctx`` the context of a
node run with autonomy ``full``. ``tool_dir`` is a directory every uid may write, for the files
a python tool writes or waits for: a root runner's tools run as a uid of their own, which may
not enter ``tmp_path``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentflows.api import flow as flow_api
from agentflows.engine import capabilities
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import ScriptedModelServer

__all__ = ["ctx", "endpoint", "model_server", "tool_dir"]


@pytest.fixture
def tool_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="agentflows-test-shared-"))
    directory.chmod(0o777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (random port)."""
    server = ScriptedModelServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def endpoint() -> Iterator[LoopbackEndpoint]:
    """A loopback HTTP service on 127.0.0.1 (random port)."""
    server = LoopbackEndpoint().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ctx() -> capabilities.NodeContext:
    """The context of a node run with autonomy full."""
    return capabilities.NodeContext(
        run_name="run-1", node_key="node", depth=0, autonomy=flow_api.Autonomy.FULL
    )
