"""Two operator replicas with leader election, and two shards, on the real control plane.

Each operator is ``agentflows operator`` as a subprocess with the operator ServiceAccount's
token (config/rbac, which grants the Lease in agentflows-system), started with its own
``--lease-name`` so no other module's operator competes. Outside a pod a replica's identity on
the Lease is ``<host>_<pid>``, so the Lease itself says which process leads. Pods are counted
from a watch of the namespace kept open for the whole test: a pod created twice for one attempt
(deleted and made again, or an attempt started again because of a failover) shows up there.
Takeover times are printed, not asserted: the machine is shared.
"""

from __future__ import annotations

import functools
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from agentflows.controller import settings
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import (
    OPERATOR_NAMESPACE,
    FlowRuns,
    OperatorProcess,
    install_operator,
    prepare_flow_namespace,
)

pytestmark = pytest.mark.cluster

RUNS = 50
KILLS = 3


def one_node_flow(name: str) -> dict[str, Any]:
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {
            "nodes": [{"id": "echo", "transform": "={n: .run.input.n}"}],
            "output": "=.nodes.echo.json",
            # every run is kept, to be counted at the end
            "successfulRunsHistoryLimit": RUNS,
        },
    }


def flowrun(name: str, flow: str, n: int) -> dict[str, Any]:
    return {
        "kind": "FlowRun",
        "metadata": {"name": name},
        "spec": {"flow": flow, "input": {"n": n}},
    }


class Replicas:
    """Operator processes sharing one Lease (or one per shard), started and stopped by the test."""

    def __init__(self, cluster: Cluster, directory: Path, lease: str) -> None:
        self.cluster = cluster
        self.directory = directory
        self.lease = lease
        self.kubeconfig = install_operator(cluster, directory)
        self.started: list[OperatorProcess] = []

    def start(self, *args: str) -> OperatorProcess:
        log = self.directory / f"operator-{len(self.started)}.log"
        argv = ["--leader-elect", "--lease-name", self.lease, *args]
        process = OperatorProcess(self.kubeconfig, log, argv)
        process.start()
        self.started.append(process)
        return process

    def holder(self, lease: str | None = None) -> str:
        try:
            found = client.CoordinationV1Api(self.cluster.api()).read_namespaced_lease(
                lease or self.lease, OPERATOR_NAMESPACE
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return ""
            raise
        return str(found.spec.holder_identity or "")

    def leader(self, among: list[OperatorProcess], lease: str | None = None) -> OperatorProcess:
        """The one of ``among`` that the Lease names, once it names one of them."""

        def named() -> OperatorProcess | None:
            holder = self.holder(lease)
            return next((p for p in among if p.alive and p.identity == holder), None)

        return wait_for(named, 60, f"the lease {lease or self.lease} to name one of {among}")

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()
            print(f"operator log: {process.log_path}")


@pytest.fixture
def replicas(
    control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    found = Replicas(
        control_plane, tmp_path_factory.mktemp("replicas"), f"test-{uuid.uuid4().hex[:8]}"
    )
    try:
        yield found
    finally:
        found.stop_all()


def leading(process: OperatorProcess) -> float:
    """The process's ``agentflows_leader`` gauge."""
    for line in process.metrics().splitlines():
        if line.startswith("agentflows_leader "):
            return float(line.split()[1])
    raise AssertionError(f"no agentflows_leader in the metrics of {process.identity}")


def wait_leading(process: OperatorProcess) -> None:
    """Wait for the gauge of a process the Lease names: it is set once the process has read
    the answer to its Lease write, a moment after others can see the Lease name it."""
    wait_for(lambda: leading(process) == 1.0, 30, f"agentflows_leader 1 on {process.identity}")


def kill(process: OperatorProcess) -> float:
    """SIGKILL the process (no lease release); the monotonic time it was killed."""
    assert process.process is not None
    process.process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    process.process.wait(timeout=30)
    return killed


class PodWatch:
    """Every pod ADDED in a namespace while the test runs, as (name, uid); watched again after
    a dropped connection from where it stopped, so no pod is missed."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.added: list[tuple[str, str]] = []
        self._watch = watch.Watch()
        self._stopped = threading.Event()
        core = cluster.core()
        version = core.list_namespaced_pod(namespace).metadata.resource_version
        self._thread = threading.Thread(
            target=self._follow, args=(core, namespace, version), daemon=True
        )
        self._thread.start()

    def _follow(self, core: client.CoreV1Api, namespace: str, version: str) -> None:
        while not self._stopped.is_set():
            try:
                for event in self._watch.stream(
                    core.list_namespaced_pod, namespace, resource_version=version
                ):
                    version = event["object"].metadata.resource_version
                    if event["type"] == "ADDED":
                        meta = event["object"].metadata
                        self.added.append((meta.name, meta.uid))
            except Exception:  # a dropped watch: again from the last version seen
                time.sleep(0.5)

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


def test_a_standby_takes_over_from_a_killed_leader_and_every_run_gets_exactly_one_pod(
    control_plane: Cluster, replicas: Replicas, namespace: str
) -> None:
    prepare_flow_namespace(control_plane, namespace)
    runs = FlowRuns(control_plane, namespace)
    pods = PodWatch(control_plane, namespace)
    processes = [replicas.start(), replicas.start()]
    leader = replicas.leader(processes)
    standby = next(p for p in processes if p is not leader)
    wait_leading(leader)
    assert leading(standby) == 0.0
    runs.apply(one_node_flow("echo"))

    names = [f"run-{i:02d}" for i in range(RUNS)]
    batches = [names[i::KILLS] for i in range(KILLS)]
    takeovers = []
    for batch in batches:
        for name in batch:
            runs.apply(flowrun(name, "echo", names.index(name)))
        time.sleep(random.uniform(0.2, 3.0))  # a random moment while the batch is being handled
        killed = kill(leader)
        leader = replicas.leader([standby])
        takeovers.append(time.monotonic() - killed)
        wait_leading(leader)
        standby = replicas.start()  # the killed one's replacement stands by
        assert leading(standby) == 0.0
    print("takeover after SIGKILL (s): " + ", ".join(f"{t:.1f}" for t in takeovers))

    for name in names:
        status = runs.wait_phase(name, "Succeeded", "Failed", timeout=300)
        assert status["phase"] == "Succeeded", (name, status.get("message"))
        assert status["attempt"] == 1, (name, status)
        assert status["output"] == {"n": names.index(name)}
    pods.stop()
    created = Counter(name for name, _uid in pods.added)
    assert {name: created[f"{name}-1"] for name in names} == dict.fromkeys(names, 1)
    assert sorted(created) == sorted(f"{name}-1" for name in names), created


def test_a_leader_stopped_with_sigterm_hands_the_lease_to_the_standby(
    control_plane: Cluster, replicas: Replicas, namespace: str
) -> None:
    prepare_flow_namespace(control_plane, namespace)
    runs = FlowRuns(control_plane, namespace)
    processes = [replicas.start(), replicas.start()]
    leader = replicas.leader(processes)
    standby = next(p for p in processes if p is not leader)
    runs.apply(one_node_flow("echo"), flowrun("before", "echo", 1))
    assert runs.wait_phase("before", "Succeeded", "Failed")["phase"] == "Succeeded"

    stopped = time.monotonic()
    leader.stop()
    assert leader.process is not None and leader.process.returncode == 0, leader.log_tail()
    assert "released lease" in leader.log_path.read_text()
    assert replicas.leader([standby]) is standby
    print(f"takeover after SIGTERM: {time.monotonic() - stopped:.1f}s")
    wait_leading(standby)
    runs.apply(flowrun("after", "echo", 2))
    status = runs.wait_phase("after", "Succeeded", "Failed")
    assert (status["phase"], status["output"]) == ("Succeeded", {"n": 2})


def test_a_leader_whose_lease_is_taken_stops_working_and_exits_non_zero(
    control_plane: Cluster, replicas: Replicas
) -> None:
    leader = replicas.start()
    assert replicas.leader([leader]) is leader
    coordination = client.CoordinationV1Api(control_plane.api())
    lease = coordination.read_namespaced_lease(replicas.lease, OPERATOR_NAMESPACE)
    lease.spec.holder_identity = "someone-else"
    coordination.replace_namespaced_lease(replicas.lease, OPERATOR_NAMESPACE, lease)
    assert leader.process is not None
    assert leader.process.wait(timeout=60) == 1
    log = leader.log_path.read_text()
    assert f"lost lease {OPERATOR_NAMESPACE}/{replicas.lease}: it is held by someone-else" in log
    assert replicas.holder() == "someone-else"


@pytest.mark.parametrize("flag", ["--leader-elect=false", "--no-leader-elect"])
def test_with_leader_election_off_the_operator_works_alone_and_takes_no_lease(
    control_plane: Cluster, replicas: Replicas, namespace: str, flag: str
) -> None:
    prepare_flow_namespace(control_plane, namespace)
    runs = FlowRuns(control_plane, namespace)
    alone = replicas.start(flag)
    assert leading(alone) == 1.0
    runs.apply(one_node_flow("echo"), flowrun("alone", "echo", 5))
    status = runs.wait_phase("alone", "Succeeded", "Failed")
    assert (status["phase"], status["output"]) == ("Succeeded", {"n": 5})
    assert replicas.holder() == ""  # no Lease of that name was created
    log = alone.log_path.read_text()
    assert "acquired lease" not in log and "standing by" not in log


def namespaces_of_each_shard(cluster: Cluster, per_shard: int) -> dict[int, list[str]]:
    """Fresh namespaces that can run flows, ``per_shard`` in each of two shards."""
    found: dict[int, list[str]] = {0: [], 1: []}
    while any(len(names) < per_shard for names in found.values()):
        name = f"t-{uuid.uuid4().hex[:10]}"
        shard = settings.shard_of(name, 2)
        if len(found[shard]) < per_shard:
            found[shard].append(name)
    for names in found.values():
        for name in names:
            cluster.core().create_namespace({"metadata": {"name": name}})
            wait_for(
                lambda n=name: cluster.core().list_namespaced_service_account(n).items,
                60,
                f"the default service account in {name}",
            )
            prepare_flow_namespace(cluster, name)
    return found


def pods_created_by(process: OperatorProcess) -> dict[str, float]:
    """``agentflows_pod_attempts_total`` of one operator, summed by namespace."""
    counts: dict[str, float] = {}
    for line in process.metrics().splitlines():
        if line.startswith("agentflows_pod_attempts_total{"):
            labels, value = line.rsplit(" ", 1)
            namespace = labels.split('namespace="', 1)[1].split('"', 1)[0]
            counts[namespace] = counts.get(namespace, 0) + float(value)
    return counts


def test_two_shards_each_handle_only_the_runs_of_their_own_namespaces(
    control_plane: Cluster, replicas: Replicas
) -> None:
    shards = namespaces_of_each_shard(control_plane, per_shard=2)
    try:
        operators = [replicas.start("--shard-index", str(i), "--shard-count", "2") for i in (0, 1)]
        for i, process in enumerate(operators):
            assert replicas.leader([process], f"{replicas.lease}-shard-{i}") is process
        for names in shards.values():
            for namespace in names:
                runs = FlowRuns(control_plane, namespace)
                runs.apply(one_node_flow("echo"), flowrun("a", "echo", 1), flowrun("b", "echo", 2))
        for names in shards.values():
            for namespace in names:
                for name in ("a", "b"):
                    status = FlowRuns(control_plane, namespace).wait_phase(
                        name, "Succeeded", "Failed"
                    )
                    assert status["phase"] == "Succeeded", (namespace, name, status.get("message"))
        for i, process in enumerate(operators):
            assert pods_created_by(process) == dict.fromkeys(shards[i], 2.0), i

        # with shard 1 stopped, shard 0 finishes a new run of its own and leaves shard 1's alone
        operators[1].stop()
        theirs, ours = FlowRuns(control_plane, shards[1][0]), FlowRuns(control_plane, shards[0][0])
        theirs.apply(flowrun("waits", "echo", 3))
        ours.apply(flowrun("later", "echo", 4))
        assert ours.wait_phase("later", "Succeeded", "Failed")["phase"] == "Succeeded"
        assert theirs.status("waits") == {}
        assert theirs.pods("waits") == []
        replicas.start("--shard-index", "1", "--shard-count", "2")
        assert theirs.wait_phase("waits", "Succeeded", "Failed")["phase"] == "Succeeded"
    finally:
        for names in shards.values():
            for namespace in names:
                control_plane.core().delete_namespace(namespace)


def test_an_operator_run_by_hand_without_flags_works_alone_and_takes_no_lease(
    control_plane: Cluster, replicas: Replicas, namespace: str
) -> None:
    # README's "Development cluster": `agentflows operator`, nothing else (issue 19, item 18)
    prepare_flow_namespace(control_plane, namespace)
    runs = FlowRuns(control_plane, namespace)
    log = replicas.directory / "by-hand.log"
    by_hand = OperatorProcess(replicas.kubeconfig, log)
    by_hand.start()
    replicas.started.append(by_hand)
    assert leading(by_hand) == 1.0
    runs.apply(one_node_flow("echo"), flowrun("by-hand", "echo", 7))
    status = runs.wait_phase("by-hand", "Succeeded", "Failed")
    assert (status["phase"], status["output"]) == ("Succeeded", {"n": 7})
    assert replicas.holder(settings.DEFAULT_LEASE_NAME) == ""
    text = log.read_text()
    assert "acquired lease" not in text and "standing by" not in text


def test_a_lease_namespace_that_is_missing_or_forbidden_is_said_once_and_on_readyz(
    control_plane: Cluster, replicas: Replicas, namespace: str
) -> None:
    lease_namespace = f"lease-{uuid.uuid4().hex[:8]}"
    log = replicas.directory / "no-lease-namespace.log"
    elect = ["--leader-elect", "--leader-election-namespace", lease_namespace]
    waiting = OperatorProcess(replicas.kubeconfig, log, [*elect, "--lease-name", replicas.lease])
    waiting.launch()
    replicas.started.append(waiting)

    def readyz_says(words: str) -> str | None:
        code, body = waiting.readyz()
        return body if code == 503 and words in body else None

    # the account may not use Leases there (the API server answers 403 before it looks
    # whether the namespace exists: the 404 case is tests/unit/test_operator_needs.py)
    control_plane.core().create_namespace({"metadata": {"name": lease_namespace}})
    body = wait_for(
        functools.partial(readyz_says, "may not use Lease"), 60, "/readyz to name the grant"
    )
    assert "config/rbac/leader_election_role.yaml" in body

    control_plane.kubectl(
        "-n",
        lease_namespace,
        "create",
        "role",
        "leases",
        "--verb=get,create,update",
        "--resource=leases.coordination.k8s.io",
    )
    control_plane.kubectl(
        "-n",
        lease_namespace,
        "create",
        "rolebinding",
        "leases",
        "--role=leases",
        f"--serviceaccount={OPERATOR_NAMESPACE}:agentflows-operator",
    )
    wait_for(waiting.ready, 60, "the operator to lead once it may")
    lines = log.read_text().splitlines()
    forbidden = [line for line in lines if "may not use Lease" in line]
    assert len(forbidden) == 1 and " ERROR " in forbidden[0], forbidden
    assert not [line for line in lines if " WARNING " in line and "lease" in line], lines
    assert any("acquired lease" in line for line in lines)
