"""API requests as the API server counted them: its audit log, read by user.

Imported by ``operator_scale.py``. The private control plane writes the log at the Metadata
level (hack/devcluster ``start(audit=True)``): one JSON line per request stage. A request is
counted once, by its ``ResponseComplete`` line, under its ``user.username`` (the operator's and
the runners' ServiceAccounts). Two kinds are set apart and reported, not counted per run:

- WATCH requests: long-running, opened at start and re-opened when the server ends them; they
  are counted by their ``ResponseStarted`` line (a watch completes only when it closes);
- the operator's own Lease (leader election): renewed on a timer whether runs come or not.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

#: Seconds without a counted request by the watched users that make "quiet".
QUIET_SECONDS = 3.0


@dataclasses.dataclass
class Tally:
    """One user's requests in a stretch of the log."""

    #: "verb resource[/subresource]" -> requests (ResponseComplete, not WATCH, not Lease)
    requests: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    watches_opened: int = 0
    lease_requests: int = 0

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def breakdown(self, runs: int, top: int = 8) -> str:
        """``12.0 get flowruns, 8.0 list agents, ...``: requests per run, largest first."""
        return ", ".join(f"{n / runs:.1f} {kind}" for kind, n in self.requests.most_common(top))


def _kind(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource") or event.get("requestURI", "?").split("?", 1)[0]
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event.get('verb', '?')} {resource}"


class AuditLog:
    """The audit log file; positions are byte offsets, so a stretch is read exactly once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def offset(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def events(self, start: int) -> tuple[list[dict[str, Any]], int]:
        """The complete lines from an offset, parsed, and the offset after the last of them."""
        with self.path.open("rb") as log:
            log.seek(start)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        events = []
        for line in complete.splitlines():
            # an offset taken while the server was writing a line starts inside it
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events, start + len(complete)

    def tally(self, start: int, users: list[str]) -> tuple[dict[str, Tally], int]:
        """Each of ``users``' requests from an offset on, and where the next stretch starts."""
        tallies = {user: Tally() for user in users}
        events, end = self.events(start)
        for event in events:
            tally = tallies.get((event.get("user") or {}).get("username", ""))
            if tally is None:
                continue
            ref = event.get("objectRef") or {}
            if event.get("verb") == "watch":
                tally.watches_opened += event.get("stage") == "ResponseStarted"
            elif event.get("stage") != "ResponseComplete":
                continue
            elif ref.get("resource") == "leases":
                tally.lease_requests += 1
            else:
                tally.requests[_kind(event)] += 1
        return tallies, end

    async def quiet(self, users: list[str], limit: float = 120) -> None:
        """Wait until ``users`` made no counted request for :data:`QUIET_SECONDS` (or ``limit``).

        A run's last writes (its Flow's summary, Events, history) come after it is terminal.
        """
        deadline = time.monotonic() + limit
        mark, since = self.offset(), time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            tallies, mark = self.tally(mark, users)
            if any(t.total for t in tallies.values()):
                since = time.monotonic()
            if time.monotonic() - since >= QUIET_SECONDS:
                return
