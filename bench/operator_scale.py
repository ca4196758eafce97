"""Operator benchmarks on the dev control plane: API requests, latencies, CPU, memory, start.

Run ``python bench/operator_scale.py --quick`` (about 4 minutes on 2 shared cores) or without
``--quick`` (see bench/README.md for how long), or ``--failover`` (operator_failover.py). It
starts a private control plane the way the cluster tests do (hack/devcluster), with the API
server's audit log on, or uses the cluster of ``--kubeconfig`` (admin); installs crds/ and
config/ as they ship; runs ``agentflows operator`` as a subprocess with its ServiceAccount's
token (exactly the RBAC of config/rbac). Runner pods are local processes of the process kubelet:
the bench holds the kubelet (SIGSTOP) while it measures pod creation and runs them at nice 19 in
a cgroup with the smallest CPU share otherwise, so the operator is measured alone. Every latency
is the difference of two receipt times (``time.monotonic``) in this process: the create call
returning, or an event on its own pod and FlowRun watches. Not a test: it asserts nothing and
is bounded by timeouts.

- ``operator API requests per run`` / ``runner API requests per run``: the ``ResponseComplete``
  lines of the API server's audit log by user (the operator's ServiceAccount, the runners'),
  over ``count`` one-node runs made one after another (each started when the last is terminal,
  the window closed when the operator has been quiet for 3 s), divided by the runs; WATCH
  requests and the operator's Lease are reported apart (operator_audit.py). The same over
  six-node runs gives the runner's requests per node.
- ``created -> pod``: ``runs`` FlowRuns of a one-node Flow created at once, the kubelet held;
  per run, from its create call returning to its pod's ADDED event.
- ``pod done -> terminal``: the same runs, the kubelet released; from when the bench first saw
  the runner done (its pod ended, or its ``result`` written: ``operator_cluster.Observer.pod_done``
  says why that cannot come out negative) to its FlowRun's terminal phase.
- ``operator CPU ms per run``: utime + stime of the operator process (/proc) over ``cpu_runs``
  one-node runs, ``cpu_in_flight`` at a time, divided by the runs.
- ``held`` FlowRuns present (finished runs, as a namespace's history holds them: created and
  given a finished run's status while the operator is stopped), then the operator started:
  ``start -> ready`` (its ``/readyz`` answers 200; an operator without /readyz: its first
  FlowRun reconcile, from ``agentflows_reconciles_total``, so marked), ``start -> caught up``
  (``caught_up_after``: what it found at start worked off), its RSS then, and ``new run -> pod``
  for ``new_runs`` runs created one at a time, the kubelet held.
- The peer, with the operator stopped: ``operator_peer.py``, a watch -> create-pod loop on the
  `kubernetes` client, in a namespace of its own; the same burst of ``runs`` runs gives the floor
  of ``created -> pod``, ``pod done -> terminal`` and CPU per run, and each operator figure is
  printed as a ratio of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import operator_audit as audit_mod
import operator_cluster as oc
from agentflows.kube import client as kube

BENCH = Path(__file__).resolve().parent


@dataclasses.dataclass
class Sizes:
    """How many runs each measure takes."""

    runs: int
    count: int
    count_six: int
    cpu_runs: int
    cpu_in_flight: int
    held: int
    new_runs: int


FULL = Sizes(
    runs=100, count=10, count_six=5, cpu_runs=1000, cpu_in_flight=20, held=10_000, new_runs=20
)
QUICK = Sizes(runs=20, count=4, count_six=2, cpu_runs=20, cpu_in_flight=10, held=500, new_runs=5)


@dataclasses.dataclass
class Bench:
    """What every measure needs: the admin client, the namespace, the watches' receipts."""

    api: kube.Client
    cluster: oc.Cluster
    namespace: str
    observer: oc.Observer
    kubelet: oc.Kubelet
    audit: audit_mod.AuditLog | None
    operator_kubeconfig: Path
    workdir: Path
    #: The audit log's offset when the operator started.
    audit_mark: int = 0

    def path(self, plural: str, name: str | None = None, sub: str | None = None) -> str:
        return kube.path_of(plural, self.namespace, name, sub=sub)

    async def create_run(self, name: str, flow: str) -> float:
        """Create a FlowRun; return when the create call returned."""
        await self.api.create(self.path("flowruns"), oc.flowrun(name, flow))
        return time.monotonic()

    async def terminal(self, names: list[str], seconds: float) -> None:
        ended = self.observer.run_ended
        await oc.wait_until(lambda: all(n in ended for n in names), seconds, "runs terminal")

    def start_operator(self, name: str = "operator") -> oc.Operator:
        return oc.Operator(self.operator_kubeconfig, self.workdir / f"{name}.log", name)


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def p50_p99(label: str, seconds: list[float]) -> str:
    p50, p99 = oc.percentile(seconds, 0.5), oc.percentile(seconds, 0.99)
    return f"{label} p50 {ms(p50)} ms p99 {ms(p99)} ms"


def ratio(ours: float, peer: float) -> str:
    return f"x{ours / peer:.1f}" if peer > 0 else "x-"


def versus(ours: list[float], peer: list[float]) -> str:
    """``operator/peer p50 x35.1 p99 x47.6``."""
    p50 = ratio(oc.percentile(ours, 0.5), oc.percentile(peer, 0.5))
    return (
        f"operator/peer p50 {p50} p99 {ratio(oc.percentile(ours, 0.99), oc.percentile(peer, 0.99))}"
    )


async def flow_ready(bench: Bench, name: str) -> None:
    """Wait until the operator has set Flow ``name`` Ready."""

    async def ready() -> bool:
        flow = await bench.api.get(bench.path("flows", name))
        conditions = (flow.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    deadline = time.monotonic() + 120
    while not await ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"Flow {name} not Ready after 120 s")
        await asyncio.sleep(0.2)


# --- created -> pod, pod done -> terminal ---------------------------------------------------------


async def burst(bench: Bench, prefix: str, runs: int) -> tuple[list[float], list[float], float]:
    """``runs`` runs of Flow ``one`` at once: (created -> pod, pod done -> terminal, wall s)."""
    names = [f"{prefix}-{i:04d}" for i in range(runs)]
    created: dict[str, float] = {}
    observer = bench.observer

    async def create(name: str) -> None:
        created[name] = await bench.create_run(name, "one")

    started = time.monotonic()
    with bench.kubelet.held():
        await asyncio.gather(*(create(n) for n in names))
        await oc.wait_until(lambda: all(n in observer.pod_added for n in names), 600, "pods")
    await bench.terminal(names, 900)
    wall = time.monotonic() - started
    to_pod = [observer.pod_added[n] - created[n] for n in names]
    to_end = []
    for name in names:
        done = observer.pod_done(name)
        assert done is not None  # a terminal run bounds it
        to_end.append(observer.run_ended[name] - done)
    return to_pod, to_end, wall


def queue_figures(text: str) -> tuple[float, float, float, float, float]:
    """So far: FlowRun reconciles, their seconds waiting and reconciling; PATCHes, their seconds."""
    count = oc.metric(text, "agentflows_reconcile_seconds_count", kind="FlowRun") or 0.0
    waited = oc.metric(text, "agentflows_workqueue_wait_seconds_sum", kind="FlowRun") or 0.0
    took = oc.metric(text, "agentflows_reconcile_seconds_sum", kind="FlowRun") or 0.0
    patches = oc.metric(text, "agentflows_api_request_seconds_count", method="PATCH") or 0.0
    patching = oc.metric(text, "agentflows_api_request_seconds_sum", method="PATCH") or 0.0
    return count, waited, took, patches, patching


def queue_breakdown(before: str, after: str, runs: int) -> str:
    """Where the burst's FlowRun reconciles spent their time, from the operator's histograms."""
    (c0, w0, t0, p0, s0), (c1, w1, t1, p1, s1) = queue_figures(before), queue_figures(after)
    count, patches = max(c1 - c0, 1.0), max(p1 - p0, 1.0)
    return (
        f"  burst: {count / runs:.1f} FlowRun reconciles per run, mean wait"
        f" {(w1 - w0) / count * 1000:.1f} ms, mean reconcile {(t1 - t0) / count * 1000:.1f} ms;"
        f" the API server answered the operator's PATCHes in {(s1 - s0) / patches * 1000:.1f} ms"
        " on average"
    )


# --- API requests -----------------------------------------------------------------------------


async def requests_per_run(
    bench: Bench, flow: str, runs: int
) -> tuple[audit_mod.Tally, audit_mod.Tally]:
    """Runs of ``flow`` one after another: the operator's and the runners' requests."""
    assert bench.audit is not None
    users = [oc.OPERATOR_USER, oc.runner_user(bench.namespace)]
    await bench.audit.quiet(users)
    start = bench.audit.offset()
    for i in range(runs):
        name = f"count-{flow}-{i:03d}"
        await bench.create_run(name, flow)
        await bench.terminal([name], 300)
    await bench.audit.quiet(users)
    tallies, _ = bench.audit.tally(start, users)
    return tallies[users[0]], tallies[users[1]]


async def api_requests(bench: Bench, sizes: Sizes) -> list[str]:
    if bench.audit is None:
        why = "n/a (the cluster writes no audit log: hack/control-plane up --audit-log)"
        return [f"operator API requests per run: {why}", f"runner API requests per run: {why}"]
    operator, runner = await requests_per_run(bench, "one", sizes.count)
    _, runner_six = await requests_per_run(bench, "six", sizes.count_six)
    lifetime, _ = bench.audit.tally(bench.audit_mark, [oc.OPERATOR_USER])
    watches = lifetime[oc.OPERATOR_USER].watches_opened
    per_run = runner_six.total / sizes.count_six
    per_node = (per_run - runner.total / sizes.count) / 5
    return [
        f"operator API requests per run: {operator.total / sizes.count:.1f}",
        f"runner API requests per run: {runner.total / sizes.count:.1f}",
        f"  ({sizes.count} one-node runs one after another, counted by the API server's audit log;"
        f" not counted: the WATCH requests the operator opened, {watches} since its start and"
        f" {operator.watches_opened} during these runs, and its {operator.lease_requests} Lease"
        " requests)",
        f"  operator per run: {operator.breakdown(sizes.count)}",
        f"  runner per run: {runner.breakdown(sizes.count)}",
        f"runner API requests per run, 6-node flow: {per_run:.1f}; per node (marginal)"
        f" {per_node:.1f}",
    ]


# --- CPU --------------------------------------------------------------------------------------


async def cpu_per_run(bench: Bench, pid: int, runs: int, in_flight: int) -> float:
    """CPU seconds of process ``pid`` per run, over ``runs`` runs, ``in_flight`` at a time."""
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            name = f"cpu-{i:05d}"
            await bench.create_run(name, "one")
            await bench.terminal([name], 900)

    before = oc.cpu_seconds(pid)
    await asyncio.gather(*(one(i) for i in range(runs)))
    if bench.audit is not None:
        await bench.audit.quiet([oc.OPERATOR_USER])
    else:
        await asyncio.sleep(3)
    return (oc.cpu_seconds(pid) - before) / runs


# --- many FlowRuns present --------------------------------------------------------------------


async def hold_runs(bench: Bench, count: int, status: dict[str, Any]) -> float:
    """Create ``count`` finished runs of Flow ``held`` (operator stopped); return seconds taken."""
    started = time.monotonic()

    async def one(i: int) -> None:
        name = f"held-{i:05d}"
        await bench.api.create(bench.path("flowruns"), oc.flowrun(name, "held"))
        await bench.api.merge_patch(bench.path("flowruns", name, "status"), {"status": status})

    await oc.bounded([functools.partial(one, i) for i in range(count)], 32)
    return time.monotonic() - started


async def ready_after(operator: oc.Operator, limit: float) -> tuple[float, str]:
    """(seconds from the operator's start to ready, how ready was told)."""
    while time.monotonic() - operator.started < limit:
        operator.check_alive()
        ready = await asyncio.to_thread(operator.readyz)
        if ready:
            return time.monotonic() - operator.started, "/readyz"
        if ready is None:
            text = await asyncio.to_thread(operator.metrics)
            if (oc.metric(text, "agentflows_reconciles_total", kind="FlowRun") or 0) > 0:
                return time.monotonic() - operator.started, "first reconcile; no /readyz"
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the operator was not ready in {limit}s; see {operator.log}")


async def caught_up_after(
    operator: oc.Operator, present: int, readyz: bool, limit: float
) -> float | None:
    """Seconds from the start until the operator has worked off what it found (None: not seen).

    Work queue empty and either a FlowRun reconcile counted for every run present, or, for an
    operator with /readyz (which need not reconcile finished runs again), no reconcile for 2 s.
    """
    last, quiet_since = None, time.monotonic()
    while time.monotonic() - operator.started < limit:
        text = await asyncio.to_thread(operator.metrics)
        depth = oc.metric(text, "agentflows_reconcile_queue_depth")
        count = oc.metric(text, "agentflows_reconciles_total", kind="FlowRun")
        if depth is None or count is None:
            return None
        if depth == 0 and count >= present:
            return time.monotonic() - operator.started
        if depth > 0 or count != last:
            last, quiet_since = count, time.monotonic()
        elif readyz and time.monotonic() - quiet_since >= 2:
            return quiet_since - operator.started
        await asyncio.sleep(0.1)
    return None


async def new_run_to_pod(bench: Bench, runs: int) -> list[float]:
    """Runs of Flow ``one`` created one at a time, the kubelet held: create -> pod ADDED."""
    latencies = []
    names = [f"new-{i:03d}" for i in range(runs)]
    with bench.kubelet.held():
        for name in names:
            created = await bench.create_run(name, "one")
            await oc.wait_until(
                functools.partial(bench.observer.pod_added.__contains__, name), 300, "pod"
            )
            latencies.append(bench.observer.pod_added[name] - created)
    await bench.terminal(names, 600)
    return latencies


async def many_runs(bench: Bench, sizes: Sizes, template: dict[str, Any]) -> list[str]:
    """The operator restarted with ``held`` finished runs present."""
    took = await hold_runs(bench, sizes.held, template)
    oc.progress(f"{sizes.held} FlowRuns created in {took:.0f} s; starting the operator")
    limit = 1800.0
    with oc.running(bench.start_operator("operator-held")) as operator:
        ready, how = await ready_after(operator, limit)
        present = len(bench.observer.phase)
        caught_up = await caught_up_after(operator, present, how == "/readyz", limit)
        await asyncio.sleep(2)
        rss, peak = oc.memory(operator.pid)
        latencies = await new_run_to_pod(bench, sizes.new_runs)
    caught = f"{caught_up:.1f} s" if caught_up is not None else f"n/a (not within {limit:.0f} s)"
    held = sizes.held
    return [
        f"operator RSS {rss:.0f} MiB with {held} FlowRuns (peak {peak:.0f} MiB)",
        f"operator start -> ready {ready:.1f} s with {held} FlowRuns ({how})",
        f"operator start -> caught up {caught} with {held} FlowRuns (each reconciled once,"
        " queue empty)",
        f"new run -> pod p50 {ms(oc.percentile(latencies, 0.5))} ms with {held} FlowRuns present"
        f" (max {ms(max(latencies))} ms over {len(latencies)})",
        f"  ({held} finished FlowRuns created in {took:.0f} s, operator stopped)",
    ]


# --- the peer ---------------------------------------------------------------------------------


@contextlib.contextmanager
def peer_process(bench: Bench, namespace: str) -> Iterator[subprocess.Popen[str]]:
    argv = [sys.executable, str(BENCH / "operator_peer.py"), str(bench.operator_kubeconfig)]
    process = subprocess.Popen(
        [*argv, namespace], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the peer exited with {process.wait()}")
        yield process
    finally:
        process.terminate()
        process.wait(timeout=20)


async def peer(bench: Bench, runs: int) -> tuple[list[float], list[float], float]:
    """The peer's burst in its own namespace: (created -> pod, pod done -> terminal, CPU s/run)."""
    namespace = f"bench-peer-{os.getpid()}"
    oc.add_namespace(bench.cluster.kubeconfig, namespace)
    own = dataclasses.replace(bench, namespace=namespace)
    watchers = bench.observer.watch(bench.api, namespace)
    try:
        with peer_process(bench, namespace) as process:
            before = oc.cpu_seconds(process.pid)
            to_pod, to_end, _ = await burst(own, "peer", runs)
            cpu = (oc.cpu_seconds(process.pid) - before) / runs
    finally:
        await oc.stop_watching(watchers)
    return to_pod, to_end, cpu


# --- the whole run ----------------------------------------------------------------------------


async def measure(bench: Bench, sizes: Sizes) -> list[str]:
    bench.audit_mark = bench.audit.offset() if bench.audit else 0
    operator = bench.start_operator()
    with oc.running(operator):
        await operator.serving()
        for name, nodes in (("one", 1), ("six", 6), ("held", 1)):
            await bench.api.create(bench.path("flows"), oc.flow(name, nodes))
            await flow_ready(bench, name)
        oc.progress(f"{sizes.runs} runs at once")
        before = operator.metrics()
        to_pod, to_end, wall = await burst(bench, "lat", sizes.runs)
        breakdown = queue_breakdown(before, operator.metrics(), sizes.runs)
        oc.progress(
            p50_p99("  created -> pod", to_pod),
            p50_p99("  pod done -> terminal", to_end),
            breakdown,
        )
        oc.progress("API requests per run")
        counted = await api_requests(bench, sizes)
        oc.progress(*counted)
        oc.progress(f"CPU over {sizes.cpu_runs} runs")
        cpu = await cpu_per_run(bench, operator.pid, sizes.cpu_runs, sizes.cpu_in_flight)
        oc.progress(f"  operator CPU ms per run {cpu * 1000:.1f}")
        template = (await bench.api.get(bench.path("flowruns", "lat-0000")))["status"]
    oc.progress(f"{sizes.held} FlowRuns present")
    held = await many_runs(bench, sizes, template)
    oc.progress(*held)
    oc.progress("the peer")
    peer_pod, peer_end, peer_cpu = await peer(bench, sizes.runs)
    names = [f"lat-{i:04d}" for i in range(sizes.runs)]
    seen, ended = bench.observer.result_seen, bench.observer.pod_ended
    by_result = sum(seen.get(n, math.inf) <= ended.get(n, math.inf) for n in names)
    return [
        *counted[:2],
        p50_p99("created -> pod", to_pod),
        p50_p99("pod done -> terminal", to_end),
        f"operator CPU ms per run {cpu * 1000:.1f} (over {sizes.cpu_runs} runs,"
        f" {sizes.cpu_in_flight} in flight)",
        *held[:4],
        *counted[2:],
        f"  ({sizes.runs} runs at once, kubelet held until every pod existed; all terminal after"
        f" {wall:.1f} s; pod done seen first as the runner's result for {by_result} of them)",
        breakdown,
        p50_p99("peer created -> pod", peer_pod)
        + f" (the kubernetes client: watch -> create pod); {versus(to_pod, peer_pod)}",
        p50_p99("peer pod done -> terminal", peer_end)
        + f" (pod watch -> status patch); {versus(to_end, peer_end)}",
        f"peer CPU ms per run {peer_cpu * 1000:.1f}; operator/peer {ratio(cpu, peer_cpu)}",
        *held[4:],
    ]


async def main_async(sizes: Sizes, cluster: oc.Cluster, workdir: Path) -> list[str]:
    namespace = f"bench-operator-{os.getpid()}"
    oc.install(cluster.kubeconfig)
    oc.add_namespace(cluster.kubeconfig, namespace)
    kubelet = oc.Kubelet(cluster.kubelet)
    if cluster.private:
        oc.progress(f"runner pods: {kubelet.lower_pods_priority()}")
    async with kube.Client.from_env(cluster.kubeconfig, retry_seconds=60) as api:
        bench = Bench(
            api=api,
            cluster=cluster,
            namespace=namespace,
            observer=oc.Observer(),
            kubelet=kubelet,
            audit=audit_mod.AuditLog(cluster.audit_log) if cluster.audit_log else None,
            operator_kubeconfig=oc.operator_kubeconfig(cluster.kubeconfig, workdir),
            workdir=workdir,
        )
        watchers = bench.observer.watch(api, namespace)
        try:
            return await measure(bench, sizes)
        finally:
            await oc.stop_watching(watchers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="An admin kubeconfig (default: a private cluster).")
    parser.add_argument("--quick", action="store_true", help="Fewer runs: a few minutes.")
    parser.add_argument(
        "--failover", action="store_true", help="Only the leader-failover measure (two operators)."
    )
    parser.add_argument("--keep", help="Keep the operators' logs in this directory.")
    parser.add_argument("--held", type=int, help="FlowRuns present (default 10,000; quick 500).")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.held:
        sizes = dataclasses.replace(sizes, held=args.held)
    # Run the clean-up (the operators, the private control plane) when stopped with SIGTERM too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = (
            Path(args.keep)
            if args.keep
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-operator-")))
        )
        workdir.mkdir(parents=True, exist_ok=True)
        stack.callback(oc.release_runners_cgroup)  # after the cluster has stopped
        cluster = stack.enter_context(oc.cluster(args.kubeconfig))
        if args.failover:
            import operator_failover

            lines = asyncio.run(operator_failover.main_async(cluster, workdir))
        else:
            lines = asyncio.run(main_async(sizes, cluster, workdir))
    for line in lines:
        print(line)
    print(f"(bench wall time {time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
