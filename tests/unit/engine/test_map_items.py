"""A map's ``items`` must give an array (issue 19, item 21).

A misspelt path evaluates to null, and a null ``items`` used to be an empty map that returned
``[]`` as if it had succeeded: the node fails with the expression and the value's type.
"""

from __future__ import annotations

import pytest

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import store

from .helpers import CountingHost, flow_spec, run_once


def _map_over(items: str) -> object:
    return flow_spec(f"""
nodes:
  - id: fan
    map:
      items: {items!r}
      tool: {{python: {{script: x}}, args: {{i: "=.item"}}}}
""")


@pytest.mark.parametrize(
    ("items", "kind"),
    [
        ("=.run.input.topcis", "null"),
        ("=.run.input", "object"),
        ("=.run.input.topics[0]", "string"),
        ("=1", "number"),
    ],
)
async def test_a_map_whose_items_are_not_an_array_fails_with_the_expression_and_type(
    items: str, kind: str
) -> None:
    host = CountingHost()
    outcome = await run_once(
        _map_over(items), store.MemoryStore(), host, value={"topics": ["a", "b"]}
    )
    assert outcome.phase == flowrun_api.RunPhase.FAILED
    assert outcome.message is not None
    assert f"map.items {items!r} gave {kind}, not an array" in outcome.message
    assert sum(host.calls.values()) == 0


async def test_a_map_over_an_empty_array_still_succeeds_with_no_items() -> None:
    outcome = await run_once(_map_over("=.run.input.topics"), store.MemoryStore(), CountingHost(),
                             value={"topics": []})  # fmt: skip
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED
    assert outcome.output == []
