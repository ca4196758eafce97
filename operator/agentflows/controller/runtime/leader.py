"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go's leaderelection does.

Called by :mod:`agentflows.controller.main`: :func:`run_leading` runs the operator's work queue
only while this process holds the Lease, so two replicas of the operator never reconcile at once.
:class:`LeaderElection` is built from the operator's flags (and checked) by
:func:`agentflows.controller.settings.leader_election`.

The protocol (client-go's, with its names):

- The Lease's ``spec`` is the record: ``holderIdentity`` (the pod name, else host and pid),
  ``leaseDurationSeconds``, ``acquireTime`` and ``renewTime`` (MicroTime) and
  ``leaseTransitions`` (how often the holder changed). Every write is a PUT carrying the
  ``resourceVersion`` that was read, so of two candidates exactly one wins; the other's 409 makes
  it read the Lease again.
- A candidate takes the Lease when it has no holder, or when its record has not changed for
  ``leaseDurationSeconds`` *as measured on the candidate's own clock* from when it first saw that
  record: clocks of different machines are never compared.
- The leader renews every ``retry_seconds``. When the Lease names someone else, leadership is
  lost: the work is cancelled at once and :class:`LeadershipLost` is raised, on which the
  operator exits non-zero, as controller-runtime's managers do (it never leads again in the
  same process). When no renewal has succeeded for ``renew_deadline_seconds`` (shorter than the
  lease, so the leader stops before a standby may take over) the work is cancelled too, but the
  process stays: unlike client-go, an API server away for a while does not restart the
  operator. It renews until the API server answers; the write carries the resourceVersion it
  last wrote, so it succeeds only if nobody took the Lease meanwhile, and the work starts again
  (the work queue carries on where it stopped); if somebody did, leadership is lost.
- On a clean stop (SIGTERM) the leader releases the Lease: no holder and a one-second duration,
  so a standby takes over at its next poll instead of waiting for the lease to run out.

Errors talking to the API server are retried at ``retry_seconds`` and logged when they change;
they never crash a standby. One that no retry mends — the Lease's namespace does not exist, or
the operator's account may not use Leases there — is logged once as an error that says what to
do and shown on ``/readyz`` (:mod:`agentflows.controller.runtime.unmet`) until it is mended.
The caller is told of every change of state (``leading``: the operator's ``agentflows_leader``
gauge, 1 leading, 0 standing by, on ``/metrics``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from agentflows.api import errors, times
from agentflows.controller.runtime import unmet
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: A stopping leader waits at most this long to release the Lease.
RELEASE_TIMEOUT_SECONDS = 5.0
#: The key of leader election's needs in :class:`~agentflows.controller.runtime.unmet.Unmet`.
NEED = "leader election"


class LeadershipLost(errors.AgentflowsError):
    """Raised when a leader loses its Lease: it must stop working (the operator exits)."""


@dataclasses.dataclass(frozen=True)
class LeaderElection:
    """The Lease replicas of one operator (one shard) compete for, and this replica's identity."""

    namespace: str
    lease_name: str
    identity: str
    #: How long a standby waits for a silent leader's record to expire (it then takes over):
    #: after a SIGKILL, a standby leads within this plus one ``retry_seconds``.
    lease_seconds: int = 10
    #: How long the leader goes on without a successful renewal before it gives up (shorter
    #: than ``lease_seconds``, so it stops before a standby may start).
    renew_deadline_seconds: float = 7.0
    #: How often the leader renews and a standby looks at the Lease.
    retry_seconds: float = 2.0


class Elector:
    """One candidate for one Lease: :meth:`acquire`, then :meth:`hold`, then :meth:`release`."""

    def __init__(
        self,
        api: kube.Client,
        election: LeaderElection,
        on_change: Callable[[bool], None] | None = None,
        needs: unmet.Unmet | None = None,
    ) -> None:
        self.api = api
        self.election = election
        self._on_change = on_change
        self._needs = needs or unmet.Unmet()
        self._path = kube.path_of("leases", election.namespace, election.lease_name)
        #: The Lease as last read or written, and when (loop time) its spec last changed.
        self._lease: dict[str, Any] | None = None
        self._observed_at = 0.0
        self.leading = False

    @property
    def where(self) -> str:
        """``namespace/name`` of the Lease, for log lines."""
        return f"{self.election.namespace}/{self.election.lease_name}"

    def holder(self) -> str:
        """Who the Lease last read names ("" when nobody)."""
        spec = (self._lease or {}).get("spec") or {}
        return str(spec.get("holderIdentity") or "")

    async def acquire(self) -> None:
        """Return once this process holds the Lease; poll it every ``retry_seconds`` till then."""
        waiting_for = None
        failed_with = ""
        while True:
            try:
                if await self._try_acquire():
                    self._needs.met(NEED)
                    self._set_leading(True)
                    spec = (self._lease or {}).get("spec") or {}
                    log.info(
                        "leading: acquired lease %s as %s (transitions: %s)",
                        self.where,
                        self.election.identity,
                        spec.get("leaseTransitions", 0),
                    )
                    return
                self._needs.met(NEED)
                failed_with = ""
                if self.holder() != waiting_for:
                    waiting_for = self.holder()
                    log.info("standing by: lease %s is held by %s", self.where, waiting_for)
            except kube.ApiError as exc:
                need = self._need(exc)
                if need:
                    self._needs.report(NEED, need)
                elif str(exc) != failed_with:
                    failed_with = str(exc)
                    log.warning("standing by: cannot take lease %s: %s (retrying)", self.where, exc)
            await asyncio.sleep(self._jittered())

    def _need(self, exc: kube.ApiError) -> str:
        """What a person must do when ``exc`` is one no retry mends ("" when a retry may)."""
        namespace = self.election.namespace
        alone = "or run this operator alone with --leader-elect=false; nothing is reconciled"
        if exc.not_found:
            return (
                f"leader election: the Lease's namespace {namespace} does not exist ({exc}): "
                f"create it (kubectl create namespace {namespace}), name another with "
                f"--leader-election-namespace, {alone} until then"
            )
        if exc.status in (401, 403):
            return (
                f"leader election: may not use Lease {self.where} ({exc}): grant the operator's "
                f"account get, create and update on leases in {namespace} "
                f"(config/rbac/leader_election_role.yaml), {alone} until then"
            )
        return ""

    async def hold(self) -> None:
        """Renew the Lease every ``retry_seconds``.

        Returns when no renewal has succeeded for ``renew_deadline_seconds`` (the API server does
        not answer: the work must pause, :meth:`regain` says when it may go on); raises
        :class:`LeadershipLost` when the Lease names someone else.
        """
        loop = asyncio.get_running_loop()
        renewed_at = loop.time()
        while True:
            await asyncio.sleep(self.election.retry_seconds)
            while True:
                left = renewed_at + self.election.renew_deadline_seconds - loop.time()
                if left <= 0:
                    log.warning(
                        "lease %s not renewed for %gs: pausing work until it is",
                        self.where,
                        self.election.renew_deadline_seconds,
                    )
                    return
                if await self._renew(within=left):
                    renewed_at = loop.time()
                    break
                await asyncio.sleep(min(self.election.retry_seconds / 2, left))

    async def regain(self) -> None:
        """After a pause, renew until the API server answers; then the work may go on.

        The renewal carries the resourceVersion this process last wrote, so it succeeds only if
        nobody took the Lease meanwhile; if someone did, :class:`LeadershipLost` is raised.
        """
        while True:
            if await self._renew(within=self.election.retry_seconds * 2):
                break
            await asyncio.sleep(self._jittered())
        log.info("lease %s renewed: resuming work", self.where)

    async def _renew(self, within: float) -> bool:
        """One renewal: True when done, False when the API server did not answer ``within``."""
        try:
            if not await asyncio.wait_for(self._try_acquire(), timeout=within):
                self._lose(f"it is held by {self.holder() or 'nobody'} now")
        except (kube.ApiError, TimeoutError) as exc:
            log.warning("renewing lease %s failed: %s", self.where, str(exc) or "timed out")
            return False
        return True

    async def release(self) -> None:
        """Give the Lease up (when this process leads) so a standby takes over at once."""
        if not self.leading or self._lease is None:
            return
        self._set_leading(False)
        now = times.timestamp()
        spec = {
            **self._lease.get("spec", {}),
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
        }
        try:
            await asyncio.wait_for(
                self.api.request("PUT", self._path, {**self._lease, "spec": spec}),
                timeout=RELEASE_TIMEOUT_SECONDS,
            )
        except (kube.ApiError, TimeoutError) as exc:
            log.warning("could not release lease %s (it expires by itself): %s", self.where, exc)
            return
        log.info("released lease %s", self.where)

    async def _try_acquire(self) -> bool:
        """One round of client-go's tryAcquireOrRenew: True when we hold the Lease after it."""
        # the fast path of a renewal: write over what we last wrote, read only on a conflict
        if self.leading and self._lease and await self._write(self._record(self._lease)):
            return True
        lease = await self._read()
        if lease is None:
            return await self._create()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.election.identity and not self._expired(spec):
            return False
        return await self._write(self._record(lease))

    async def _read(self) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = await self.api.get(self._path)
        except kube.ApiError as exc:
            if exc.not_found:
                return None
            raise
        if self._lease is None or lease.get("spec") != self._lease.get("spec"):
            self._observed_at = asyncio.get_running_loop().time()
        self._lease = lease
        return lease

    def _expired(self, spec: dict[str, Any]) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or self.election.lease_seconds)
        return asyncio.get_running_loop().time() >= self._observed_at + duration

    def _record(self, lease: dict[str, Any]) -> dict[str, Any]:
        """``lease`` naming us as holder, renewed now (and acquired now if it was not ours)."""
        old = lease.get("spec") or {}
        now = times.timestamp()
        spec = {
            **old,
            "holderIdentity": self.election.identity,
            "leaseDurationSeconds": self.election.lease_seconds,
            "renewTime": now,
        }
        if old.get("holderIdentity") != self.election.identity or not old.get("acquireTime"):
            spec["acquireTime"] = now
            if old:
                spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
        return {**lease, "spec": spec}

    async def _create(self) -> bool:
        now = times.timestamp()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.election.lease_name, "namespace": self.election.namespace},
            "spec": {
                "holderIdentity": self.election.identity,
                "leaseDurationSeconds": self.election.lease_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            self._lease = await self.api.create(
                kube.path_of("leases", self.election.namespace), body
            )
        except kube.ApiError as exc:
            if exc.conflict:
                return False  # another candidate created it first
            raise
        self._observed_at = asyncio.get_running_loop().time()
        return True

    async def _write(self, lease: dict[str, Any]) -> bool:
        """PUT with the resourceVersion read; False on a conflict (someone else wrote first)."""
        try:
            self._lease = await self.api.request("PUT", self._path, lease)
        except kube.ApiError as exc:
            if exc.conflict:
                return False
            raise
        self._observed_at = asyncio.get_running_loop().time()
        return True

    def _set_leading(self, leading: bool) -> None:
        self.leading = leading
        if self._on_change is not None:
            self._on_change(leading)

    def _lose(self, why: str) -> NoReturn:
        self._set_leading(False)
        message = f"lost lease {self.where}: {why}; stopping"
        log.error("%s", message)
        raise LeadershipLost(message)

    def _jittered(self) -> float:
        # client-go's JitterUntil: standbys do not poll in step
        return self.election.retry_seconds * (1 + 0.2 * random.random())


async def run_leading(
    election: LeaderElection | None,
    api: kube.Client,
    work: Callable[[], Awaitable[None]],
    *,
    leading: Callable[[bool], None],
    needs: unmet.Unmet,
) -> None:
    """Run ``work()`` while this process leads (always, when ``election`` is None).

    ``leading`` is called with every change of state (True at once without an election);
    ``needs`` is told of what no retry mends (``/readyz`` shows it). Raises
    :class:`LeadershipLost` (after cancelling ``work``) when the Lease is lost; releases the
    Lease when ``work`` ends or this task is cancelled (a clean stop).
    """
    if election is None:
        leading(True)
        await work()
        return
    # its own connection, no retries of its own: the renew deadline bounds every attempt
    client = kube.Client(api.config, retry_seconds=0, timeout=election.retry_seconds * 2)
    elector = Elector(client, election, leading, needs)
    try:
        await elector.acquire()
        await _work_while_holding(elector, work)
    finally:
        # a stop cancels this task, maybe more than once: the release (bounded) still completes
        cancelled = await _run_to_end(elector.release())
        await client.close()
        if cancelled:
            raise asyncio.CancelledError


async def _work_while_holding(elector: Elector, work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work()`` while renewing; pause it while the Lease cannot be renewed."""
    while True:
        working = asyncio.ensure_future(work())
        holding = asyncio.ensure_future(elector.hold())
        done: set[asyncio.Future[None]] = set()
        try:
            done, _ = await asyncio.wait({working, holding}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (working, holding):
                task.cancel()
            await asyncio.gather(working, holding, return_exceptions=True)
        if holding not in done or holding.cancelled():
            # the work ended (or was cancelled from outside: the operator is stopping)
            if working in done and not working.cancelled():
                working.result()
            return
        holding.result()  # LeadershipLost, or None: not renewed in time, the work is paused
        await elector.regain()


async def _run_to_end(step: Awaitable[None]) -> bool:
    """Await ``step`` to its end even through cancellations; True when there was one."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    return cancelled
