"""``bench/operator_scale.py --failover``: SIGKILL the leading operator during 50 runs.

Imported by ``operator_scale.py``. Two ``agentflows operator`` processes run with the same
ServiceAccount, named ``operator-a`` and ``operator-b`` by ``$POD_NAME`` (their identity on the
Lease, as the downward API gives it in a Deployment); leader election is the operator's default
(``--leader-elect``, Lease ``agentflows-operator`` in ``agentflows-system``). The bench creates
50 one-node runs, one every 0.2 s; after the 25th it SIGKILLs the process the Lease names, then
reads the Lease every 0.1 s until it names the other one. It prints

    leader failover N s; duplicate pods N; stuck runs N

- ``leader failover``: from the SIGKILL to the bench first reading the standby's name on the
  Lease (the standby may take over only once the dead leader's record has gone unrenewed for the
  lease duration, as measured on the standby's clock);
- ``duplicate pods``: over all runs, the runner pods the bench's watch saw (distinct uids) beyond
  the attempts the run's status counts: a second pod for one attempt;
- ``stuck runs``: runs not terminal 300 s after the last was created.

An operator without leader election writes no Lease: then both processes work at once, the
failover figure is "n/a" and the other two still say what two such replicas do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import operator_cluster as oc
from agentflows.kube import client as kube

RUNS = 50
INTERVAL = 0.2
LEASE = ("agentflows-system", "agentflows-operator")
STUCK_AFTER = 300.0


async def holder(api: kube.Client) -> str | None:
    try:
        lease = await api.get(kube.path_of("leases", LEASE[0], LEASE[1]))
    except kube.ApiError as error:
        if error.not_found:
            return None
        raise
    return (lease.get("spec") or {}).get("holderIdentity") or None


async def first_holder(
    api: kube.Client, ours: dict[str, oc.Operator], seconds: float
) -> str | None:
    """The one of ``ours`` the Lease names (None: no Lease appeared: no leader election)."""
    deadline = time.monotonic() + seconds
    found = None
    while time.monotonic() < deadline:
        found = await holder(api)
        if found in ours:
            return found
        await asyncio.sleep(0.2)
    if found is not None:
        raise RuntimeError(f"the Lease still names {found!r}, neither of {sorted(ours)}")
    return None


async def taken_over(api: kube.Client, standby: str, since: float, limit: float) -> float | None:
    """Seconds from ``since`` until the Lease names ``standby`` (None: not within ``limit``)."""
    while time.monotonic() - since < limit:
        if await holder(api) == standby:
            return time.monotonic() - since
        await asyncio.sleep(0.1)
    return None


async def failover(
    api: kube.Client, namespace: str, observer: oc.Observer, ops: dict[str, oc.Operator]
) -> list[str]:
    leader = await first_holder(api, ops, 60)
    victim = leader or "operator-a"
    standby = next(name for name in ops if name != victim)
    names = [f"fo-{i:03d}" for i in range(RUNS)]
    takeover: asyncio.Task[float | None] | None = None
    for i, name in enumerate(names):
        await api.create(kube.path_of("flowruns", namespace), oc.flowrun(name, "one"))
        if i == RUNS // 2 - 1:
            ops[victim].kill()
            if leader is not None:
                takeover = asyncio.create_task(taken_over(api, standby, time.monotonic(), 120))
        await asyncio.sleep(INTERVAL)
    seconds = await takeover if takeover is not None else None
    ended = observer.run_ended
    with contextlib.suppress(TimeoutError):
        await oc.wait_until(lambda: all(n in ended for n in names), STUCK_AFTER, "runs")
    stuck = sum(n not in ended for n in names)
    duplicates = sum(
        max(0, len(observer.pod_uids.get(n, ())) - observer.attempt.get(n, 0)) for n in names
    )
    if leader is None:
        took = "n/a (no Lease agentflows-system/agentflows-operator: both operators worked)"
    elif seconds is None:
        took = "n/a (the standby did not lead within 120 s)"
    else:
        took = f"{seconds:.1f} s"
    return [
        f"leader failover {took}; duplicate pods {duplicates}; stuck runs {stuck}",
        f"  ({RUNS} runs, one every {INTERVAL} s; {victim} SIGKILLed after run {RUNS // 2})",
    ]


async def main_async(cluster: oc.Cluster, workdir: Path) -> list[str]:
    namespace = f"bench-failover-{os.getpid()}"
    oc.install(cluster.kubeconfig)
    oc.add_namespace(cluster.kubeconfig, namespace)
    kubelet = oc.Kubelet(cluster.kubelet)
    if cluster.private:
        oc.progress(f"runner pods: {kubelet.lower_pods_priority()}")
    config = oc.operator_kubeconfig(cluster.kubeconfig, workdir)
    observer = oc.Observer()
    async with kube.Client.from_env(cluster.kubeconfig, retry_seconds=60) as api:
        watchers = observer.watch(api, namespace)
        names = ("operator-a", "operator-b")
        ops = {
            name: oc.Operator(config, workdir / f"{name}.log", name, "--leader-elect")
            for name in names
        }
        try:
            for operator in ops.values():
                await operator.serving()
            await api.create(kube.path_of("flows", namespace), oc.flow("one", 1))
            return await failover(api, namespace, observer, ops)
        finally:
            for operator in ops.values():
                operator.stop()
            await oc.stop_watching(watchers)
