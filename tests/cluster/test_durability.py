"""Durability of runs on a real control plane: killed pods, a restarted operator, huge outputs.

The operator runs as in ``test_operator.py`` (a subprocess with its ServiceAccount's token).
The flows here are chains of Python tool nodes that append ``<time> start|end <run> <node>``
lines to one journal file on the test's board (:mod:`tests.support.tool_board`), sleeping in between so that pods
live long enough to be hit. A node whose result was checkpointed has a ``finishedAt`` in the
run's status; a ``start`` line for the same (run, node) later than that instant would mean a
finished node ran again. A node that was running when its pod died may run again, and does.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from agentflows.api import times
from tests.cluster.harness import Cluster, controlplane, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator, python_tool
from tests.support.tool_board import CLIENT, BoardFile, ToolBoard

pytestmark = pytest.mark.cluster

RUNS = 20
CHAIN = ("n1", "n2", "n3", "n4", "n5")

# The journal is a file on the test's board: the pods cannot see the test's files, and the
# journal must outlive the pods it records.
JOURNALED = (
    CLIENT
    + """
import json, sys, time
args = json.load(sys.stdin)
def mark(kind):
    append(args["journal"], f"{time.time():.6f} {kind} {args['run']} {args['node']}\\n")
mark("start")
time.sleep(args["sleep"])
mark("end")
print(json.dumps({"node": args["node"]}))
"""
)


def chain_flow(name: str, journal: BoardFile, sleep: float) -> dict[str, Any]:
    nodes = [
        {
            "id": node,
            "tool": python_tool(
                JOURNALED,
                {
                    "journal": str(journal),
                    "run": "{{ .run.input.name }}",
                    "node": node,
                    "sleep": sleep,
                },
            ),
        }
        for node in CHAIN
    ]
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {
            "nodes": nodes,
            "output": "={last: .nodes.n5.json.node}",
            "retry": {"maxAttempts": 10, "backoffSeconds": 1},
            "successfulRunsHistoryLimit": 100,
        },
    }


def flowrun(name: str, flow_name: str) -> dict[str, Any]:
    return {
        "kind": "FlowRun",
        "metadata": {"name": name},
        "spec": {"flow": flow_name, "input": {"name": name}},
    }


def journal_lines(journal: BoardFile) -> list[tuple[float, str, str, str]]:
    """(time, start|end, run, node) per line of the journal."""
    rows = []
    for line in journal.read_text().splitlines():
        stamp, kind, run, node = line.split()
        rows.append((float(stamp), kind, run, node))
    return rows


def assert_no_finished_node_ran_again(runs: FlowRuns, names: list[str], journal: BoardFile) -> int:
    """Check every run's finished nodes against the journal; return how many nodes re-ran."""
    starts: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    ends: dict[tuple[str, str], int] = collections.Counter()
    for stamp, kind, run, node in journal_lines(journal):
        if kind == "start":
            starts[run, node].append(stamp)
        else:
            ends[run, node] += 1
    reran = 0
    for name in names:
        nodes = runs.status(name)["nodes"]
        for node in CHAIN:
            record = nodes[node]
            assert record["phase"] == "Succeeded", (name, node, record)
            finished_at = times.parse_time(record["finishedAt"])
            assert finished_at is not None, record
            finished = finished_at.timestamp()
            later = [s for s in starts[name, node] if s > finished]
            assert not later, f"{name}/{node} finished at {finished} and started again at {later}"
            assert ends[name, node] >= 1, f"{name}/{node} is Succeeded but its tool never ended"
            reran += len(starts[name, node]) - 1
    return reran


def wait_all_succeeded(runs: FlowRuns, names: list[str], timeout: float) -> None:
    def done() -> bool:
        phases = {name: runs.status(name).get("phase") for name in names}
        failed = {n: p for n, p in phases.items() if p in ("Failed", "Cancelled")}
        assert not failed, {n: runs.status(n).get("message") for n in failed}
        return all(p == "Succeeded" for p in phases.values())

    wait_for(done, timeout, f"{len(names)} runs Succeeded", interval=2)


class PodWatcher:
    """Every runner pod of a namespace seen by a watch (relisting after each expiry)."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.seen: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PodWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _record(self, pod: client.V1Pod) -> None:
        labels = pod.metadata.labels or {}
        if "agentflows.io/run" in labels:
            key = (labels["agentflows.io/run"], int(labels["agentflows.io/attempt"]))
            self.seen[key].add(pod.metadata.uid)

    def _loop(self) -> None:
        selector = "agentflows.io/run"
        while not self._stop.is_set():
            try:
                listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
                for pod in listed.items:
                    self._record(pod)
                stream = watch.Watch()
                for event in stream.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=5,
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(event["object"])
            except Exception:  # the API server may be away: look again
                time.sleep(0.5)


def assert_one_pod_per_attempt(runs: FlowRuns, names: list[str], watcher: PodWatcher) -> None:
    for name in names:
        last = runs.status(name)["attempt"]
        attempts = sorted(a for (run, a) in watcher.seen if run == name)
        assert attempts and attempts[-1] == last, (name, attempts, last)
        for attempt in attempts:
            uids = watcher.seen[name, attempt]
            assert len(uids) == 1, f"attempt {attempt} of {name} had pods {uids}"


def current_pod_not_deleted(status: dict[str, Any], deleted: list[str]) -> bool:
    """Whether the run's current pod is one not deleted yet (a deleted one may still linger)."""
    return bool(status.get("pod")) and status["pod"] not in deleted


def mid_chain(status: dict[str, Any]) -> bool:
    """Whether a node has finished and the last one has not started (it sleeps, so the runner
    cannot write its result between our reading this and deleting the pod)."""
    nodes = status.get("nodes") or {}
    return CHAIN[-1] not in nodes and any(r.get("phase") == "Succeeded" for r in nodes.values())


# ----- runner pods deleted at random ------------------------------------------------------------


def test_runs_survive_runner_pods_deleted_at_random_without_rerunning_finished_nodes(
    control_plane: Cluster, runs: FlowRuns, tool_board: ToolBoard
) -> None:
    journal = tool_board / "journal"
    names = [f"chaos-{i:02d}" for i in range(RUNS)]
    runs.apply(chain_flow("chaos", journal, sleep=0.7), *(flowrun(n, "chaos") for n in names))
    chooser = random.Random(4)
    deleted: list[str] = []
    hits: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + 150
    while len(deleted) < 8 and time.monotonic() < deadline:
        time.sleep(chooser.uniform(0.5, 2.5))
        statuses = {n: runs.status(n) for n in names}
        if all(s.get("phase") == "Succeeded" for s in statuses.values()):
            break
        running = [
            (n, s["pod"])
            for n in names
            if hits[n] < 2
            and current_pod_not_deleted(s := statuses[n], deleted)
            and s.get("phase") == "Running"
            and mid_chain(s)
        ]
        if not running:
            continue
        name, pod = chooser.choice(running)
        try:
            control_plane.core().delete_namespaced_pod(pod, runs.namespace)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            continue
        deleted.append(pod)
        hits[name] += 1
    assert len(deleted) >= 4, f"too few pods deleted while runs were active: {deleted}"

    wait_all_succeeded(runs, names, timeout=240)
    for name in names:
        assert runs.status(name)["output"] == {"last": "n5"}
    for name in names:
        # a deletion costs an attempt unless it lands just after the runner wrote its result
        # (the pod was already finishing): the attempt count is bounded, not exact
        assert 1 <= runs.status(name)["attempt"] <= hits[name] + 1, name
    assert sum(runs.status(n)["attempt"] - 1 for n in names) >= 1
    reran = assert_no_finished_node_ran_again(runs, names, journal)
    print(f"deleted {len(deleted)} pods; {reran} running node(s) ran again")


# ----- the operator restarted while runs are in flight ------------------------------------------


def test_operator_restarted_twice_during_twenty_runs_makes_one_pod_per_attempt(
    control_plane: Cluster, runs: FlowRuns, operator: Operator, tool_board: ToolBoard
) -> None:
    journal = tool_board / "journal"
    names = [f"restart-{i:02d}" for i in range(RUNS)]
    with PodWatcher(control_plane.core(), runs.namespace) as watcher:
        runs.apply(
            chain_flow("restart", journal, sleep=0.7), *(flowrun(n, "restart") for n in names)
        )
        wait_for(lambda: len(watcher.seen) >= 3, 120, "the first runner pods")
        operator.restart()
        wait_for(lambda: len(watcher.seen) >= RUNS // 2, 180, "half the runs started")
        operator.restart()
        wait_all_succeeded(runs, names, timeout=240)
        final = {(n, runs.status(n)["attempt"]) for n in names}
        # the watch has delivered each run's pod of its last attempt (no fixed wait for it)
        wait_for(lambda: final.issubset(list(watcher.seen)), 60, "the last attempts' pods watched")
    assert_one_pod_per_attempt(runs, names, watcher)
    assert {runs.status(n)["attempt"] for n in names} == {1}, "a restart lost an attempt"
    assert_no_finished_node_ran_again(runs, names, journal)
    assert operator.alive


# ----- outputs far larger than an object may be -------------------------------------------------


def test_ten_mib_output_leaves_the_flowrun_small_and_the_cli_shows_it_whole(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    size = 10 * 1024 * 1024
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "huge"},
            "spec": {
                # A transform: a python tool's stdout is capped at 4 MiB.
                "nodes": [{"id": "big", "transform": f'={{blob: ("x" * {size}), tail: "end"}}'}],
                "output": "=.nodes.big.json",
            },
        },
        flowrun("huge-1", "huge"),
    )
    sizes = []

    def finished() -> bool:
        obj = runs.run("huge-1")
        sizes.append(len(json.dumps(obj)))
        return (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    wait_for(finished, 240, "the run finished")
    status = runs.status("huge-1")
    assert status["phase"] == "Succeeded", status.get("message")
    assert max(sizes) < 256 * 1024, f"the FlowRun grew to {max(sizes)} bytes"
    assert status["outputRef"].startswith("configmap:")
    assert status["nodes"]["big"]["outputRef"].startswith("configmap:")

    shown = subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", "get", "huge-1", "-o", "json",
         "-n", runs.namespace, "--kubeconfig", str(control_plane.kubeconfig())],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["phase"] == "Succeeded"
    assert info["output"]["tail"] == "end"
    assert info["output"]["blob"] == "x" * size
    assert info["nodes"]["big"]["output"]["json"]["blob"] == "x" * size
    assert info["nodes"]["big"]["output"]["json"]["tail"] == "end"


# ----- the API server away for a while ----------------------------------------------------------


class ApiServerProcess:
    """The control plane's kube-apiserver, stopped and started again with the same flags."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        pid = cluster.cp.pids["kube-apiserver"]
        self.argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert b"kube-apiserver" in self.argv[0], self.argv

    def stop(self) -> None:
        controlplane._terminate_group(self.cluster.cp.pids["kube-apiserver"], grace=10)

    def start(self) -> None:
        """Start it again; ``controlplane.stop`` at the session's end finds the new pid."""
        argv = [arg.decode() for arg in self.argv]
        controlplane._spawn(self.cluster.cp, "kube-apiserver", argv)
        wait_for(self.ready, 60, "kube-apiserver /readyz")

    def ready(self) -> bool:
        try:
            return controlplane.api_get(self.cluster.cp, "/readyz")[0] == 200
        except OSError:
            return False


@pytest.fixture
def apiserver(control_plane: Cluster) -> Iterator[ApiServerProcess]:
    """The kube-apiserver; after the test it serves again whatever happened."""
    process = ApiServerProcess(control_plane)
    try:
        yield process
    finally:
        if not process.ready():
            process.start()


def test_runs_in_flight_finish_after_the_api_server_is_down_for_ten_seconds(
    control_plane: Cluster,
    runs: FlowRuns,
    operator: Operator,
    apiserver: ApiServerProcess,
    tool_board: ToolBoard,
) -> None:
    """kube-apiserver is stopped (connections refused) for 10 s while six runs are in flight.

    The runs' pods have all started first, so what is measured is the operator and the runners
    riding out the outage, not pods being started through it.
    """
    journal = tool_board / "journal"
    names = [f"away-{i}" for i in range(6)]
    runs.apply(chain_flow("away", journal, sleep=1.5), *(flowrun(n, "away") for n in names))

    def all_pods_started() -> bool:
        pods = runs.cluster.core().list_namespaced_pod(
            runs.namespace, label_selector="agentflows.io/run"
        )
        phases = {p.metadata.labels["agentflows.io/run"]: p.status.phase for p in pods.items}
        running = sum(phase == "Running" for phase in phases.values())
        return set(phases) == set(names) and "Pending" not in phases.values() and running >= 4

    wait_for(all_pods_started, 120, "every run's pod started, most still Running")
    apiserver.stop()
    assert not apiserver.ready()
    time.sleep(10)
    apiserver.start()
    wait_all_succeeded(runs, names, timeout=240)
    assert_no_finished_node_ran_again(runs, names, journal)
    assert {runs.status(n)["attempt"] for n in names} == {1}
    assert operator.alive
