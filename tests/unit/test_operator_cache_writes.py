"""The operator's cache takes what its own writes return (``Cache.stored``).

A reconcile reads the cache, not the API server, so a write's answer must be held at once:
otherwise the next reconcile decides from what the write replaced.
"""

from __future__ import annotations

from agentflows.controller import cache


async def test_a_write_answer_is_held_even_as_the_first_object_of_its_namespace() -> None:
    enqueued: list[tuple[str, str, str]] = []
    held = cache.Cache(
        None,  # type: ignore[arg-type]  # no list or watch runs: only what writes return
        ("team",),
        lambda namespace: True,
        lambda kind, namespace, name, delay=0.0: enqueued.append((kind, namespace, name)),
    )
    run = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "metadata": {"name": "etl-1", "namespace": "team", "resourceVersion": "7"},
        "spec": {"flow": "etl"},
        "status": {"phase": "Pending", "attempt": 1},
    }
    held.stored(run)

    found = held.run_of("team", "etl-1")
    assert found is not None and found.status.attempt == 1
    assert ("FlowRun", "team", "etl-1") in enqueued
