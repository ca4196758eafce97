"""The run's limits.timeoutSeconds bounds every expression of the run, not only the run loop.

A jq program cannot be interrupted in the thread that runs it, so the loop's own timer is not
enough: the evaluator must be told the run's deadline and stop its worker there.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentflows.engine import expressions, store
from tests.unit.engine.helpers import CountingHost, flow_spec, run_once

LOOPING = """
limits: {timeoutSeconds: 1}
nodes:
  - {id: spin, transform: "=def f: f; f"}
"""


def test_a_looping_expression_is_stopped_by_the_run_deadline_and_its_worker_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the run's deadline, the per-expression default (raised here to an hour) would
    # hold the evaluator that long and the worker would still be spinning after the run ended.
    monkeypatch.setattr(expressions, "DEFAULT_TIMEOUT_SECONDS", 3600.0)
    spec = flow_spec(LOOPING)
    result: dict[str, Any] = {}

    def run() -> None:
        result["outcome"] = asyncio.run(run_once(spec, store.MemoryStore(), CountingHost()))

    # a daemon thread, so a regression shows as a failure here rather than a hung suite
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert "outcome" in result, "the run was still evaluating its expression after 120 s"
    outcome = result["outcome"]
    assert outcome.phase.value == "Failed"
    assert outcome.reason == "Timeout"
    # the same pool answers at once: nothing is left spinning on the killed program
    again = expressions.compile_expression("[range(3)] | length")
    assert expressions.evaluate(again, expressions.Scope({})) == 3
