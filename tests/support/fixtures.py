"""Pytest fixtures for the agents layer; wire them in with ``from tests.support.fixtures import *``.

``model_server`` is a :class:`~tests.support.model_server.ScriptedModelServer` on loopback,
started for the test and stopped after it. ``server.model_spec()`` points a ModelSpec at it and
``server.env`` is the environment its apiKey secret resolves from. ``endpoint`` is a
:class:`~tests.support.endpoint.LoopbackEndpoint` for the http tool, and ``ctx`` the context of a
node run with autonomy ``full``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentflows.api import flow as flow_api
from agentflows.engine import capabilities
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import ScriptedModelServer

__all__ = ["ctx", "endpoint", "model_server"]


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
