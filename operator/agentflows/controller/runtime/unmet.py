"""What the operator needs and cannot get: each need logged once, as an error, and on ``/readyz``.

Called by :mod:`agentflows.controller.runtime.leader` (the Lease's namespace is missing, or the
operator's account may not use Leases there) and read by the ``/readyz`` handler of
:meth:`agentflows.controller.metrics.Metrics.serve`. A condition that no retry can meet — only a
person can, by creating a namespace, granting a permission or changing a flag — is not a
warning repeated every few seconds: it is one ERROR line that says what to do, shown on
``/readyz`` (503) until it is met, and one INFO line when it is.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("agentflows.controller")


class Unmet:
    """The needs not met now, by a key of their own (``leader-election``...), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._needs: dict[str, str] = {}

    def report(self, key: str, message: str) -> None:
        """``key`` is not met, for ``message``: logged once (again only if the message changes)."""
        with self._lock:
            known = self._needs.get(key)
            self._needs[key] = message
        if known != message:
            log.error("%s", message)

    def met(self, key: str) -> None:
        """``key`` is met now."""
        with self._lock:
            known = self._needs.pop(key, None)
        if known is not None:
            log.info("%s: met now", key)

    def messages(self) -> list[str]:
        """What is not met, one line each (empty: nothing)."""
        with self._lock:
            return [self._needs[key] for key in sorted(self._needs)]
