"""Fixtures for the agents tests: the scripted model server and a loopback HTTP endpoint."""

from tests.support.fixtures import ctx, endpoint, model_server  # noqa: F401  (fixtures)
