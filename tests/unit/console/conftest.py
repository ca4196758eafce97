"""Fixtures shared by the local console's tests: a waiting local run and its console."""

from tests.unit.console.test_console_local import console, waiting_run  # noqa: F401  (fixtures)
