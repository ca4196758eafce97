"""A reconcile error that retrying cannot fix: a Warning Event, once, and ``Stalled`` in status.

The work queue (tests/unit/test_workqueue.py) stops retrying such an error; here its hook in the
operator (``controller/stalled.py``) records it on a FlowRun served by a loopback API server
(``tests/support/fake_flowrun_api.py``), and the run's next reconcile that passes removes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentflows.api import common, errors
from agentflows.controller import context, stalled
from agentflows.controller.runtime import workqueue
from tests.support.fake_flowrun_api import FakeFlowRunApi, controller_on

KEY = workqueue.Key(workqueue.FLOWRUN, "team", "etl-1")


@pytest.fixture
async def operator() -> AsyncIterator[tuple[FakeFlowRunApi, context.Controller]]:
    fake = FakeFlowRunApi(KEY.namespace, KEY.name, spec={"flow": "etl"})
    async with controller_on(fake) as ctl:
        yield fake, ctl


class Reconciles:
    """A reconcile that fails for good while ``broken``, run by a real work queue."""

    def __init__(self, ctl: context.Controller) -> None:
        self.ctl = ctl
        self.broken = True
        self.calls: list[workqueue.Key] = []
        ctl.queue = workqueue.WorkQueue(self.reconcile, workers=1, on_terminal=stalled.record(ctl))

    async def reconcile(self, key: workqueue.Key) -> float | None:
        self.calls.append(key)
        if self.broken:
            raise errors.PermanentError("ConfigMap team/etl-1-out-0 is gone")
        await stalled.clear(self.ctl, key)  # as main.dispatch does after every reconcile
        return None

    async def settle(self) -> None:
        """Add the key and let the queue work until it has nothing left to do."""
        queue = self.ctl.queue
        queue.add(KEY)
        worker = asyncio.create_task(queue.run())
        await asyncio.sleep(0.05)
        for _ in range(1000):
            if not queue.pending():
                break
            await asyncio.sleep(0.01)
        worker.cancel()
        assert queue.due(KEY) is None  # no retry, no backoff


async def test_a_reconcile_error_retrying_cannot_fix_is_an_event_and_a_stalled_condition(
    operator: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator
    reconciles = Reconciles(ctl)

    await reconciles.settle()

    # once, and once more for the condition's own write (as for any status write)
    assert reconciles.calls == [KEY, KEY]
    (event,) = fake.events
    assert (event["type"], event["reason"]) == ("Warning", "ReconcileFailed")
    assert event["involvedObject"]["kind"] == "FlowRun"
    assert event["involvedObject"]["name"] == "etl-1"
    assert event["involvedObject"]["uid"] == "uid-1"
    assert event["message"].startswith("ConfigMap team/etl-1-out-0 is gone; the operator does not")
    assert "until the FlowRun or what it refers to changes" in event["message"]
    condition = common.condition_of(fake.status.get("conditions"), "Stalled")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "ReconcileFailed")
    assert condition["message"] == event["message"]
    cached = ctl.cache.run_of(KEY.namespace, KEY.name)
    assert cached is not None
    (held,) = [c for c in cached.status.conditions if c.type == "Stalled"]
    assert held.message == condition["message"]


async def test_the_next_reconcile_that_passes_removes_the_stalled_condition(
    operator: tuple[FakeFlowRunApi, context.Controller],
) -> None:
    fake, ctl = operator
    reconciles = Reconciles(ctl)
    await reconciles.settle()
    patches = len(fake.writes())

    reconciles.broken = False  # the cause was fixed, and the run edited
    await reconciles.settle()

    assert common.condition_of(fake.status.get("conditions"), "Stalled") is None
    assert len(fake.writes()) == patches + 1
    await stalled.clear(ctl, KEY)  # nothing to remove: nothing written
    assert len(fake.writes()) == patches + 1
    assert len(fake.events) == 1
