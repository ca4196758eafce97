"""Large maps: bounded work and memory, and limits checked before the first item starts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, store

from .helpers import CountingHost, flow_spec, run_once

RunPhase = flowrun_api.RunPhase


class TaskCountingHost(CountingHost):
    """Records the most asyncio tasks alive while a tool call runs."""

    def __init__(self) -> None:
        super().__init__()
        self.max_tasks = 0

    async def call_tool(self, task: capabilities.ToolTask, ctx: capabilities.NodeContext) -> Any:
        self.max_tasks = max(self.max_tasks, len(asyncio.all_tasks()))
        return await super().call_tool(task, ctx)


def _map_flow(items: int, concurrency: int = 4, limits: str = "") -> Any:
    return flow_spec(f"""
{limits}
nodes:
  - id: fan
    map:
      items: "=[range(0; {items})]"
      maxItems: 10000
      concurrency: {concurrency}
      tool: {{python: {{script: x}}, args: {{i: "=.item"}}}}
""")


async def test_a_map_over_more_items_than_executions_left_stops_before_any_item_runs() -> None:
    host = CountingHost()
    st = store.MemoryStore()
    outcome = await run_once(_map_flow(10_000, limits="limits: {maxNodeExecutions: 50}"), st, host)
    assert outcome.phase == RunPhase.FAILED
    assert outcome.reason == "NodeExecutionLimitExceeded"
    assert outcome.message == (
        'node "fan": map.items gave 10000 items to run, over the 49 node executions '
        "limits.maxNodeExecutions=50 leaves"
    )
    assert sum(host.calls.values()) == 0 and not any("[" in key for key in st.checkpoint.nodes)


async def test_a_map_keeps_only_its_concurrency_in_flight_however_many_items() -> None:
    host = TaskCountingHost()
    outcome = await run_once(_map_flow(300, concurrency=2), store.MemoryStore(), host)
    assert outcome.phase == RunPhase.SUCCEEDED
    assert [item["args"]["i"] for item in outcome.output] == list(range(300))
    assert host.max_tasks <= 4  # the run, the map node and its two workers


async def test_a_map_over_thousands_of_items_runs_on_the_file_store(tmp_path: Path) -> None:
    st = store.FileStore(tmp_path / "run.json")
    outcome = await run_once(_map_flow(2_000, concurrency=8), st, CountingHost())
    assert outcome.phase == RunPhase.SUCCEEDED and len(outcome.output) == 2_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    assert len(store.FileStore(tmp_path / "run.json").read().nodes) == 2_001


async def test_a_map_body_that_reads_items_sees_the_whole_list() -> None:
    spec = flow_spec("""
nodes:
  - id: fan
    map:
      items: '=["a", "b", "c"]'
      tool: {python: {script: x}, args: {item: "=.item", of: "=.items | length"}}
""")
    outcome = await run_once(spec, store.MemoryStore(), CountingHost())
    assert [o["args"] for o in outcome.output] == [
        {"item": "a", "of": 3},
        {"item": "b", "of": 3},
        {"item": "c", "of": 3},
    ]
