"""Trying again: how long to wait first, when to stop, and whether another try may help.

The one owner of retry arithmetic (issue 21). Every loop that tries again takes its delays from
a :class:`Backoff` and asks :func:`status_may_help` whether an HTTP answer is worth another try:
the model client, a node's ``retry``, the Kubernetes client, the informer and the
``kubernetes`` triggers' watches, the session and status stores' conflict loops, Budget charges,
the work queue, refused runner pods and the runner-log follower. What counts as an attempt,
what is logged and what is counted stay with each caller, and so does the sleeping (most sleep
in asyncio; the operator hands a delay to its work queue), so this is arithmetic that a test
checks without a clock.

- :class:`Backoff` is a policy: the first delay (``initial``), the factor each later delay is
  multiplied by, the ``cap`` of one delay, the ``jitter`` (the random share taken off a delay:
  0.5 waits between 50% and 100% of it, 1 anywhere up to it, AWS's "full jitter"), and the
  bounds of the whole: ``attempts`` (tries in total, the first included) and ``deadline``
  (seconds from the first try; no retry starts that would begin after it).
- :meth:`Backoff.delay` is the delay before retry ``n``; :meth:`Backoff.delay_since` the delay
  when no count survives, only the time the failures began (the waits grow by ``factor`` when
  each lasts as long as the ones before it together, for a factor of 2), for state kept in an
  object's status across operator restarts.
- :class:`Tries` is one operation's count and clock: :meth:`Tries.failed` counts a failure and
  returns the delay before the next try, or None when the policy allows none
  (:meth:`Tries.next_delay` for a loop that never gives up); :meth:`Tries.reset` starts again
  after a success, for loops that run for ever (a watch).

Whether a failure is worth another try is the error's to say: the project's errors
(:mod:`agentflows.api.errors`), ``kube.client.ApiError`` and the stores' errors carry a
``retryable`` flag, and where that flag comes from an HTTP status, it comes from
:func:`status_may_help`.

Why not tenacity (not a dependency: only the dev tools' langgraph pulls it in): most
loops above need only "the n-th delay" (the work queue, lost attempts, refused pods, nodes), a
count that resets after a success, or a delay derived from a time in status; a decorator that
owns the loop fits three of them, and the arithmetic would still be written out for the rest.

Plain Python without I/O: every layer may import it, the engine included.
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
import random
import time
from collections.abc import Callable

#: Statuses whose request may succeed when it is sent again unchanged: 408 Request Timeout,
#: 425 Too Early, 429 Too Many Requests (every 5xx too, see :func:`status_may_help`).
TRANSIENT_STATUSES = frozenset({408, 425, 429})


def status_may_help(status: int, *, conflict_passes: bool = False) -> bool:
    """Whether sending a request again may succeed where it was answered with HTTP ``status``.

    Yes for 408, 425, 429 and every 5xx. A 409 Conflict passes by itself only where the server
    means a lock that times out (``conflict_passes``: model providers; OpenAI's own client
    retries it); a Kubernetes 409 (AlreadyExists, a stale resourceVersion) needs a re-read
    first, which its callers do. Any other status under 500 says the request itself is wrong.
    """
    return status in TRANSIENT_STATUSES or status >= 500 or (conflict_passes and status == 409)


@dataclasses.dataclass(frozen=True)
class Backoff:
    """A retry policy: growing, capped, optionally jittered delays, bounded by tries or time."""

    #: Seconds before the first retry.
    initial: float
    #: Each later delay is the one before times this (1: the same delay every time).
    factor: float = 2.0
    #: Upper bound of one delay, before jitter.
    cap: float = math.inf
    #: Random share taken off each delay: 0 none, 0.5 waits between 50% and 100% of it.
    jitter: float = 0.0
    #: Tries in total, the first included (1 never retries); None: no bound.
    attempts: int | None = None
    #: Seconds from the first try after which no retry may start; None: no bound.
    deadline: float | None = None

    def __post_init__(self) -> None:
        for name, ok, valid in (
            ("initial", self.initial >= 0, "0 or more seconds"),
            ("factor", self.factor >= 1, "1 or more"),
            ("cap", self.cap >= 0, "0 or more seconds"),
            ("jitter", 0 <= self.jitter <= 1, "between 0 and 1"),
            ("attempts", self.attempts is None or self.attempts >= 1, "1 or more, or None"),
            ("deadline", self.deadline is None or self.deadline >= 0, "0 or more, or None"),
        ):
            if not ok:
                raise ValueError(f"Backoff.{name}: {getattr(self, name)!r}; must be {valid}")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1: the second try), jitter applied."""
        if retry < 1:
            raise ValueError(f"retry: {retry}; the first retry is 1")
        try:
            grown = self.initial * self.factor ** (retry - 1) if self.initial else 0.0
        except OverflowError:  # a key failing for days: the cap holds long before this
            grown = math.inf
        return self._jittered(min(grown, self.cap))

    def delay_since(self, elapsed: float) -> float:
        """The delay when no count is kept, only that the failures began ``elapsed`` s ago.

        Each wait is ``factor - 1`` times the time already spent, at least ``initial``, at most
        ``cap``: with a factor of 2 a wait lasts as long as all the ones before it, so the
        waits double as :meth:`delay`'s do, and the state is one time a restart keeps.
        """
        grown = max(self.initial, max(elapsed, 0.0) * (self.factor - 1))
        return self._jittered(min(grown, self.cap))

    def tries(self, clock: Callable[[], float] = time.monotonic) -> Tries:
        """A count of one operation's tries under this policy, its deadline read on ``clock``."""
        return Tries(self, clock)

    def _jittered(self, delay: float) -> float:
        return delay * (1 - self.jitter * random.random()) if self.jitter else delay


class Tries:
    """One operation's failures so far and when it began, under a :class:`Backoff`."""

    def __init__(self, policy: Backoff, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        #: Failed tries since the start or the last :meth:`reset`.
        self.failures = 0
        self._began = clock()

    def failed(self, at_least: float | None = None) -> float | None:
        """Count a failed try; the seconds to wait before the next, or None: give up.

        ``at_least`` is the wait the other side asked for (an HTTP ``Retry-After``,
        :func:`retry_after`): the delay is never shorter. None when the tries are spent
        (``attempts``) or when the wait would end after the ``deadline`` (so a retry never
        starts past it).
        """
        delay = max(self.next_delay(), at_least or 0.0)
        policy = self.policy
        if policy.attempts is not None and self.failures >= policy.attempts:
            return None
        if policy.deadline is not None and self._clock() + delay > self._began + policy.deadline:
            return None
        return delay

    def next_delay(self) -> float:
        """Count a failed try; the seconds to wait before the next, whatever the bounds.

        For the loops that never give up (a watch lists again until it is cancelled).
        """
        self.failures += 1
        return self.policy.delay(self.failures)

    def reset(self) -> None:
        """A try succeeded: the next failure waits the first delay again, the deadline restarts."""
        self.failures = 0
        self._began = self._clock()


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds an HTTP ``Retry-After`` header asks to wait (RFC 9110 §10.2.3), or None.

    The header is delta-seconds (``"120"``) or an HTTP-date; ``now`` is the epoch time a date
    is read against (the current time by default). A date in the past is 0; anything else
    (absent, negative, unparseable) is None, and the policy's own delay applies.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_after_note(seconds: float | None) -> str:
    """What a retry's log line adds for the wait its answer asked: ``" (Retry-After: 2s)"``.

    Empty when the answer asked none (``seconds`` is None, as :func:`retry_after` returns).
    """
    return "" if seconds is None else f" (Retry-After: {seconds:g}s)"
