"""Pytest fixtures for the agents layer; wire them in with ``from tests.support.fixtures import *``.

``model_server`` is a :class:`~tests.support.model_server.ScriptedModelServer` on loopback,
started for the test and stopped after it. ``server.model_spec()`` points a ModelSpec at it and
``server.env`` is the environment its apiKey secret resolves from.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.model_server import ScriptedModelServer

__all__ = ["model_server"]


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (random port)."""
    server = ScriptedModelServer().start()
    try:
        yield server
    finally:
        server.stop()
