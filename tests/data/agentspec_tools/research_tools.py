"""ServerTool implementations for research_flow.yaml (agentflows run --tools)."""

import asyncio


async def web_search(query: str) -> dict[str, object]:
    """Pretend to search: the results name the query."""
    await asyncio.sleep(0)
    return {"results": [f"{query}: first hit", f"{query}: second hit"], "took_ms": 3}


def _helper() -> None:
    """Private: not a tool."""
