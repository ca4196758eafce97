"""A keyed work queue: de-duplicated, one worker per key at a time, delayed re-adds.

The reconcilers are level-triggered: any event about an object (or about a pod it owns) just
adds the object's :class:`Key`. A key waiting in the queue is not added twice; a key added while
its reconcile runs is processed once more afterwards; a reconcile returns how many seconds until
it wants to look again (a backoff, a deadline, a TTL), or None. A reconcile that raises is retried
with a per-key exponential backoff, unless the error says trying again cannot help (an
:class:`~agentflows.api.errors.AgentflowsError` whose ``retryable`` is False, e.g. a
:class:`~agentflows.api.errors.PermanentError`; controller-runtime's ``TerminalError``): then
the key is not retried, the failure is logged once and handed to ``on_terminal``
(:mod:`agentflows.controller.stalled`: a Warning Event and the object's ``Stalled``
condition), and the key is reconciled again only when it is added again (the object or what it
refers to changed). Other errors (a bug, a retryable error) are retried with backoff, and so is
an API server's refusal (:class:`~agentflows.kube.client.ApiError`) whatever its status: its
``retryable`` is about the one request, and the next reconcile reads again (a conflict, an
object gone or not there yet). Kept in memory only: a restarted operator rebuilds it from the
cache's first lists.

Namespaces share the workers fairly (:class:`FairQueue`): waiting keys are kept in one line
per namespace and workers take from the lines in turn, so 1,000 FlowRuns created in team-b
delay team-a's one run by at most one reconcile per worker, not by 1,000. Within a namespace
keys keep their order.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from agentflows.api import errors, retry
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: Kinds of keys the operator reconciles.
AGENT = "Agent"
FLOW = "Flow"
FLOWRUN = "FlowRun"
#: A Flow's finished runs, checked against its history limits.
HISTORY = "History"
#: A Flow's run summary (``activeRuns``, ``lastRun``), written at most once a second.
SUMMARY = "Summary"
#: A namespace's Budget: windows rolled over, gauges, held runs looked at again.
BUDGET = "Budget"
#: A memory's AgentSessions (the key's name is the memory), checked against its retention.
SESSIONS = "Sessions"


@dataclasses.dataclass(frozen=True, order=True)
class Key:
    """What to reconcile: a kind, a namespace and a name."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


Reconciler = Callable[[Key], Awaitable[float | None]]
ErrorHook = Callable[[Key, BaseException], None]
#: Called (and awaited) once for an error that retrying cannot fix: the key is not retried.
TerminalHook = Callable[[Key, BaseException], Awaitable[None]]
#: Called after each reconcile with the seconds the key waited (from the first add since its last
#: reconcile began: while that reconcile still ran, then in the queue) and the seconds the
#: reconcile took (the operator's ``agentflows_workqueue_wait_seconds``/``reconcile_seconds``).
TimingHook = Callable[[Key, float, float], None]


class FairQueue:
    """Keys waiting for a worker: a line per namespace, served round-robin."""

    def __init__(self) -> None:
        self._lines: dict[str, collections.deque[Key]] = {}
        #: namespaces with waiting keys, in the order they are served next
        self._turns: collections.deque[str] = collections.deque()
        #: one permit per waiting key: ``get`` waits for one (and is cancellable while it does)
        self._waiting = asyncio.Semaphore(0)

    def put(self, key: Key) -> None:
        """Put ``key`` at the end of its namespace's line."""
        line = self._lines.get(key.namespace)
        if line is None:
            line = self._lines[key.namespace] = collections.deque()
            self._turns.append(key.namespace)
        line.append(key)
        self._waiting.release()

    async def get(self) -> Key:
        """The first key of the namespace whose turn it is (waiting for one if none is)."""
        await self._waiting.acquire()
        namespace = self._turns.popleft()
        line = self._lines[namespace]
        key = line.popleft()
        if line:
            self._turns.append(namespace)
        else:
            del self._lines[namespace]
        return key


class WorkQueue:
    """Runs ``reconcile(key)`` for added keys with a bounded number of workers."""

    def __init__(
        self,
        reconcile: Reconciler,
        *,
        workers: int = 8,
        on_error: ErrorHook | None = None,
        on_terminal: TerminalHook | None = None,
        on_timing: TimingHook | None = None,
        max_backoff: float = 60.0,
    ) -> None:
        self._reconcile = reconcile
        self._workers = workers
        self._on_error = on_error
        self._on_terminal = on_terminal
        self._on_timing = on_timing
        #: A failing key's retries: 0.5 s doubling to ``max_backoff``, for as long as it fails.
        self._backoff = retry.Backoff(initial=0.5, cap=max_backoff)
        self._queue = FairQueue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[Key, int] = {}
        #: The last terminal error of each key that failed so (logged once, not at every try).
        self._terminal: dict[Key, str] = {}
        #: when each queued key was put in the queue
        self._added_at: dict[Key, float] = {}

    def add(self, key: Key, delay: float = 0.0) -> None:
        """Reconcile ``key`` now, or after ``delay`` seconds (the earliest request wins)."""
        if delay > 0:
            self._add_later(key, delay)
            return
        if key in self._active:
            if key not in self._dirty:
                self._dirty.add(key)
                self._added_at[key] = asyncio.get_running_loop().time()
        elif key not in self._queued:
            self._queued.add(key)
            self._added_at.setdefault(key, asyncio.get_running_loop().time())
            self._queue.put(key)

    def _add_later(self, key: Key, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= due:
                return
            existing[1].cancel()
        handle = loop.call_later(delay, self._fire, key)
        self._timers[key] = (due, handle)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def due(self, key: Key) -> float | None:
        """When (event-loop time) a delayed re-add of ``key`` is due, or None when none is."""
        timer = self._timers.get(key)
        return timer[0] if timer is not None else None

    def pending(self) -> int:
        """Keys waiting or being processed (for tests and metrics)."""
        return len(self._queued) + len(self._active)

    async def run(self) -> None:
        """Process keys until cancelled.

        Run again after that (a leader that paused, :mod:`agentflows.controller.runtime.leader`), it
        carries on: the keys whose reconcile was cut short or whose delay was pending come first.
        """
        workers = [asyncio.create_task(self._worker()) for _ in range(self._workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            timers, self._timers = self._timers, {}
            for key, (_, handle) in sorted(timers.items()):
                handle.cancel()
                self.add(key)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            loop = asyncio.get_running_loop()
            started = loop.time()
            waited = started - self._added_at.pop(key, started)
            requeue: float | None
            try:
                requeue = await self._reconcile(key)
                self._failures.pop(key, None)
                self._terminal.pop(key, None)
            except asyncio.CancelledError:
                self._active.discard(key)
                self.add(key)  # not done: first in line if the queue runs again
                raise
            except Exception as exc:
                requeue = await self._failed(key, exc)
            finally:
                self._active.discard(key)
            if self._on_timing is not None:
                self._on_timing(key, waited, loop.time() - started)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            if requeue is not None:
                self.add(key, max(requeue, 0.05))

    async def _failed(self, key: Key, exc: Exception) -> float | None:
        """Log a failed reconcile; the seconds until its retry, or None when none can help."""
        if self._on_error is not None:
            self._on_error(key, exc)
        if terminal(exc):
            self._failures.pop(key, None)
            said = str(exc)
            # once per cause: the Stalled condition's own write reconciles the key again
            level = logging.DEBUG if self._terminal.get(key) == said else logging.ERROR
            self._terminal[key] = said
            log.log(
                level,
                "reconciling %s failed and trying again cannot help: %s; not retried until "
                "the object or what it refers to changes",
                key,
                exc,
            )
            if self._on_terminal is not None:
                await self._on_terminal(key, exc)
            return None
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        requeue = self._backoff.delay(failures)
        log.exception("reconciling %s failed (try %d); again in %.1fs", key, failures, requeue)
        return requeue


def terminal(exc: BaseException) -> bool:
    """Whether the error says trying the same reconcile again cannot help (not retried)."""
    return (
        isinstance(exc, errors.AgentflowsError)
        and not exc.retryable
        and not isinstance(exc, kube.ApiError)
    )
