"""The operator's work queue: de-duplication, re-adds while busy, and its timing figures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from agentflows.agents import sessions
from agentflows.api import errors
from agentflows.controller import metrics as metrics_mod
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube

A = workqueue.Key(workqueue.FLOWRUN, "ns", "a")
B = workqueue.Key(workqueue.FLOWRUN, "ns", "b")


async def until(check: Callable[[], bool]) -> None:
    """Let the queue work until ``check()`` holds (at most 10 s)."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the queue did not get there in 10 s")


def test_a_key_added_twice_while_queued_is_reconciled_once() -> None:
    seen: list[workqueue.Key] = []

    async def reconcile(key: workqueue.Key) -> float | None:
        seen.append(key)
        return None

    async def main() -> None:
        queue = workqueue.WorkQueue(reconcile, workers=1)
        queue.add(A)
        queue.add(A)
        worker = asyncio.create_task(queue.run())
        await until(lambda: not queue.pending())
        worker.cancel()

    asyncio.run(main())
    assert seen == [A]


def test_a_key_added_while_its_reconcile_runs_is_reconciled_once_more_afterwards() -> None:
    seen: list[workqueue.Key] = []
    release = asyncio.Event()

    async def reconcile(key: workqueue.Key) -> float | None:
        seen.append(key)
        if len(seen) == 1:
            await release.wait()
        return None

    async def main() -> None:
        queue = workqueue.WorkQueue(reconcile, workers=2)
        queue.add(A)
        worker = asyncio.create_task(queue.run())
        await until(lambda: bool(seen))
        queue.add(A)
        queue.add(A)
        release.set()
        await until(lambda: not queue.pending())
        worker.cancel()

    asyncio.run(main())
    assert seen == [A, A]


def test_a_key_behind_a_busy_worker_reports_the_wait_and_each_reconcile_its_time() -> None:
    timings: dict[workqueue.Key, tuple[float, float]] = {}
    held = 0.2

    async def reconcile(key: workqueue.Key) -> float | None:
        if key == A:
            await asyncio.sleep(held)
        return None

    def on_timing(key: workqueue.Key, waited: float, took: float) -> None:
        timings[key] = (waited, took)

    async def main() -> None:
        queue = workqueue.WorkQueue(reconcile, workers=1, on_timing=on_timing)
        queue.add(A)
        queue.add(B)
        worker = asyncio.create_task(queue.run())
        await until(lambda: len(timings) == 2)
        worker.cancel()

    asyncio.run(main())
    # one worker: B could start only once A's reconcile had held it for `held` seconds
    assert timings[A][1] >= held
    assert timings[B][0] >= held


def test_queue_timings_are_exported_as_histograms_by_kind() -> None:
    metrics = metrics_mod.Metrics()
    metrics.queue_timing(A, 0.003, 0.012)
    metrics.queue_timing(workqueue.Key(workqueue.FLOW, "ns", "f"), 0.5, 0.1)

    def sample(name: str, kind: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"kind": kind})

    assert sample("agentflows_workqueue_wait_seconds_count", "FlowRun") == 1
    assert sample("agentflows_workqueue_wait_seconds_sum", "FlowRun") == 0.003
    assert sample("agentflows_reconcile_seconds_sum", "FlowRun") == 0.012
    assert sample("agentflows_reconcile_seconds_sum", "Flow") == 0.1


def test_a_key_added_while_its_reconcile_runs_counts_the_rest_of_that_reconcile_as_wait() -> None:
    waits: list[float] = []
    added = asyncio.Event()
    held = 0.2

    async def reconcile(key: workqueue.Key) -> float | None:
        if not waits and not added.is_set():
            await added.wait()
            await asyncio.sleep(held)  # the new add waits this long behind the running reconcile
        return None

    async def main() -> None:
        queue = workqueue.WorkQueue(
            reconcile, workers=1, on_timing=lambda _key, waited, _took: waits.append(waited)
        )
        queue.add(A)
        worker = asyncio.create_task(queue.run())
        await until(lambda: queue.pending() == 1 and not queue._queued)
        queue.add(A)
        added.set()
        await until(lambda: len(waits) == 2)
        worker.cancel()

    asyncio.run(main())
    assert waits[1] >= held


def test_a_namespace_with_a_thousand_keys_delays_another_namespaces_key_by_one_turn() -> None:
    # One worker, 1,000 FlowRuns of team-b queued before team-a's one: team-a's is the second
    # reconciled (after the team-b key first in line), not the 1,001st; team-b's keep order.
    crowd = [workqueue.Key(workqueue.FLOWRUN, "team-b", f"run-{i}") for i in range(1000)]
    alone = workqueue.Key(workqueue.FLOWRUN, "team-a", "run")
    seen: list[workqueue.Key] = []

    async def reconcile(key: workqueue.Key) -> float | None:
        seen.append(key)
        return None

    async def main() -> None:
        queue = workqueue.WorkQueue(reconcile, workers=1)
        for key in crowd:
            queue.add(key)
        queue.add(alone)
        worker = asyncio.create_task(queue.run())
        await until(lambda: not queue.pending())
        worker.cancel()

    asyncio.run(main())
    assert seen.index(alone) == 1
    assert [key for key in seen if key != alone] == crowd


def test_namespaces_take_turns_whatever_order_their_keys_came_in() -> None:
    keys = [workqueue.Key(workqueue.FLOWRUN, ns, f"r{i}") for ns in "abc" for i in range(3)]
    seen: list[str] = []

    async def reconcile(key: workqueue.Key) -> float | None:
        seen.append(key.namespace)
        return None

    async def main() -> None:
        queue = workqueue.WorkQueue(reconcile, workers=1)
        for key in keys:
            queue.add(key)
        worker = asyncio.create_task(queue.run())
        await until(lambda: not queue.pending())
        worker.cancel()

    asyncio.run(main())
    assert "".join(seen) == "abcabcabc"


def test_an_error_that_retrying_cannot_fix_is_not_retried_and_is_recorded_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=workqueue.__name__)
    calls: list[workqueue.Key] = []
    recorded: list[tuple[workqueue.Key, str]] = []
    counted: list[workqueue.Key] = []

    async def reconcile(key: workqueue.Key) -> float | None:
        calls.append(key)
        raise errors.PermanentError("offload reference 'x' is not 'configmap:<prefix>:<parts>'")

    async def record(key: workqueue.Key, exc: BaseException) -> None:
        recorded.append((key, str(exc)))

    async def main() -> None:
        queue = workqueue.WorkQueue(
            reconcile, workers=1, on_error=lambda k, _e: counted.append(k), on_terminal=record
        )
        queue.add(A)
        worker = asyncio.create_task(queue.run())
        await until(lambda: bool(recorded) and not queue.pending())
        assert queue.due(A) is None  # no retry scheduled
        queue.add(A)  # the object changed: reconciled again
        await until(lambda: len(recorded) == 2 and not queue.pending())
        assert queue.due(A) is None
        worker.cancel()

    asyncio.run(main())
    assert calls == [A, A]
    assert counted == [A, A]
    assert [key for key, _ in recorded] == [A, A]
    assert "configmap:<prefix>:<parts>" in recorded[0][1]
    # the same cause again (the Stalled condition's own write reconciles the key): one ERROR
    said = [r.levelno for r in caplog.records if "trying again cannot help" in r.getMessage()]
    assert said == [logging.ERROR, logging.DEBUG]


@pytest.mark.parametrize(
    "error",
    [
        sessions.StoreError("AgentSession team/s: still conflicting", retryable=True),
        kube.ApiError(409, "Conflict", "the object has been modified"),
        kube.ApiError(404, "NotFound", 'pods "etl-1-1" not found'),
        RuntimeError("the API server is not there yet"),
    ],
    ids=["retryable", "api-conflict", "api-not-found", "not-of-the-tree"],
)
def test_an_error_that_may_pass_is_retried_with_backoff(error: Exception) -> None:
    calls: list[workqueue.Key] = []
    recorded: list[workqueue.Key] = []

    async def reconcile(key: workqueue.Key) -> float | None:
        calls.append(key)
        if len(calls) == 1:
            raise error
        return None

    async def record(key: workqueue.Key, _exc: BaseException) -> None:
        recorded.append(key)

    async def main() -> None:
        queue = workqueue.WorkQueue(reconcile, workers=1, on_terminal=record)
        queue.add(A)
        worker = asyncio.create_task(queue.run())
        await until(lambda: bool(calls) and not queue.pending())
        assert queue.due(A) is not None  # backed off, not dropped
        await until(lambda: len(calls) == 2 and not queue.pending())
        worker.cancel()

    asyncio.run(main())
    assert not workqueue.terminal(error)
    assert calls == [A, A]
    assert recorded == []


def test_a_key_failing_for_days_is_retried_at_the_cap_without_the_delay_overflowing() -> None:
    async def reconcile(key: workqueue.Key) -> float | None:
        raise RuntimeError("still down")

    queue = workqueue.WorkQueue(reconcile, workers=1, max_backoff=60.0)
    queue._failures[A] = 5000  # 3.5 days of failures at 60 s apart: 2.0 ** 5000 overflowed
    assert asyncio.run(queue._failed(A, RuntimeError("still down"))) == 60.0
