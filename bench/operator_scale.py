"""Operator benchmarks on loopback: pod-start and finish latencies, status patches, memory.

Run ``python bench/operator_scale.py`` (about 4 minutes on 2 cores) or ``--quick``. It uses the
cluster in ``--kubeconfig`` (admin), else starts a private control plane the way the cluster
tests do (hack/devcluster) and stops it afterwards. It installs crds/ and config/ as they ship,
runs ``agentflows operator`` as a subprocess with its ServiceAccount's token (exactly the RBAC of
config/rbac), and measures:

- ``created -> pod``: ``--runs`` FlowRuns of a one-node Flow created at once; for each, the time
  from its create call returning to its runner pod's ADDED event on the bench's pod watch.
- ``pod done -> run terminal``: for the same runs, from the bench's watch first seeing the pod
  ended (phase Succeeded/Failed) to its FlowRun watch first seeing a terminal phase. Both are
  receipt times on one clock; container ``finishedAt`` has whole seconds only, so it is not used.
  A negative value means the operator had finished the run from the runner's ``result`` before
  the kubelet reported the pod ended.
- ``status patches``: ``apiserver_request_total`` for PATCH flowruns/status from the API
  server's /metrics (all writers: operator and runners), before and after a batch of runs of a
  1-node and of a 6-node Flow; per node = (6-node batch - 1-node batch) / (5 x runs).
- ``operator RSS``: VmRSS (and peak VmHWM) of the operator process from /proc, idle and then with
  ``--settle`` FlowRuns present, created for a Flow that does not exist so they fail without
  pods; measured once every one of them is Failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from agentflows.kube import client as kube

REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"Succeeded", "Failed", "Cancelled"}
OPERATOR = ("agentflows-system", "agentflows-operator")


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Iterator[str]:
    """Yield an admin kubeconfig path: the given one, or a private control plane's."""
    if kubeconfig:
        yield kubeconfig
        return
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import controlplane

    state_dir = controlplane.temporary_state_dir()
    plane = controlplane.start(state_dir)
    try:
        yield str(plane.kubeconfig("admin"))
    finally:
        controlplane.stop(state_dir)


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        text=True,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- installing and running the operator -------------------------------------------------------


def install(kubeconfig: str, namespace: str) -> None:
    """CRDs, the operator's namespace, RBAC and policies; the runner's account in ``namespace``."""
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl(kubeconfig, "apply", "-f", str(REPO / "config/manager/namespace.yaml"))
    kubectl(kubeconfig, "apply", "-k", str(REPO / "config/rbac"))
    kubectl(kubeconfig, "apply", "-k", str(REPO / "config/policies"))
    kubectl(kubeconfig, "create", "namespace", namespace)
    for name in ("service_account.yaml", "role.yaml", "role_binding.yaml"):
        document = yaml.safe_load((REPO / "config/rbac/runner" / name).read_text())
        document["metadata"]["namespace"] = namespace
        for subject in document.get("subjects", []):
            subject["namespace"] = namespace
        kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(document))


def operator_kubeconfig(kubeconfig: str, directory: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the operator's ServiceAccount."""
    namespace, account = OPERATOR
    token = kubectl(kubeconfig, "create", "token", account, "-n", namespace, "--duration=24h")
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    entry = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [{"name": account, "user": {"token": token.strip()}}],
        "contexts": [{"name": "op", "context": {"cluster": entry["name"], "user": account}}],
        "current-context": "op",
    }
    path = directory / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def operator_process(kubeconfig: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    port = free_port()
    env = {**os.environ, "AGENTFLOWS_RUNNER_IMAGE": "agentflows:bench"}
    env.pop("KUBECONFIG", None)
    argv = [sys.executable, "-m", "agentflows.cli.main", "operator"]
    argv += ["--kubeconfig", str(kubeconfig), "--metrics-port", str(port)]
    with log.open("ab") as output:
        process = subprocess.Popen(
            argv, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        for _ in range(600):
            if process.poll() is not None:
                raise RuntimeError(f"the operator exited with {process.returncode}; see {log}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).close()
                break
            time.sleep(0.1)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


# --- watching ----------------------------------------------------------------------------------


async def watch_forever(
    api: kube.Client, path: str, handle: Callable[[dict[str, Any]], None], **params: Any
) -> None:
    """List then watch ``path`` until cancelled, calling ``handle`` on every object seen."""
    while True:
        try:
            listed = await api.get(path, **params)
            for item in listed.get("items", []):
                handle(item)
            version = listed["metadata"]["resourceVersion"]
            async for event in api.watch(
                path, resource_version=version, timeout_seconds=60, **params
            ):
                if event.get("type") in ("ADDED", "MODIFIED"):
                    handle(event["object"])
                elif event.get("type") == "ERROR":
                    break
        except kube.ApiError:
            await asyncio.sleep(0.5)


class Observer:
    """Receipt times (perf_counter) of pods appearing and ending, and of runs ending."""

    def __init__(self) -> None:
        self.pod_added: dict[str, float] = {}
        self.pod_ended: dict[str, float] = {}
        self.run_ended: dict[str, float] = {}

    def pod(self, pod: dict[str, Any]) -> None:
        now = time.perf_counter()
        run = pod["metadata"].get("labels", {}).get("agentflows.io/run")
        if run is None:
            return
        self.pod_added.setdefault(run, now)
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.pod_ended.setdefault(run, now)

    def run(self, run: dict[str, Any]) -> None:
        if (run.get("status") or {}).get("phase") in TERMINAL:
            self.run_ended.setdefault(run["metadata"]["name"], time.perf_counter())


def flow(name: str, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {
            "nodes": [{"id": f"n{i}", "transform": f"={i}"} for i in range(nodes)],
            "successfulRunsHistoryLimit": 10_000,
            "failedRunsHistoryLimit": 10_000,
        },
    }


def flowrun(name: str, flow_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "metadata": {"name": name},
        "spec": {"flow": flow_name},
    }


async def bounded(jobs: list[Callable[[], Awaitable[Any]]], concurrency: int) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def wait_until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {seconds}s waiting for {what}")
        await asyncio.sleep(0.2)


# --- the measurements --------------------------------------------------------------------------


def kubelet_pid(kubeconfig: str) -> int | None:
    """The process kubelet of a hack/control-plane cluster (its pid file sits by the kubeconfig)."""
    pid_file = Path(kubeconfig).parent / "run" / "kubelet.pid"
    return int(pid_file.read_text()) if pid_file.exists() else None


async def bench_latency(
    api: kube.Client, ns: str, observer: Observer, runs: int, kubelet: int | None
) -> list[str]:
    await api.create(kube.path_of("flows", ns), flow("one", 1))
    await asyncio.sleep(2)  # the Flow validated (Ready) before the burst
    created: dict[str, float] = {}
    names = [f"lat-{i:04d}" for i in range(runs)]

    async def create(name: str) -> None:
        await api.create(kube.path_of("flowruns", ns), flowrun(name, "one"))
        created[name] = time.perf_counter()

    # With the process kubelet frozen, the burst measures the operator alone: otherwise the
    # first runner processes (a Python start each) take the 2 cores the operator needs. In a
    # real cluster runner pods run on other nodes.
    if kubelet:
        os.kill(kubelet, signal.SIGSTOP)
    started = time.perf_counter()
    try:
        await asyncio.gather(*(create(n) for n in names))
        await wait_until(lambda: all(n in observer.pod_added for n in names), 300, "pods created")
    finally:
        if kubelet:
            os.kill(kubelet, signal.SIGCONT)
    await wait_until(lambda: all(n in observer.run_ended for n in names), 900, "runs terminal")
    wall = time.perf_counter() - started
    to_pod = [observer.pod_added[n] - created[n] for n in names]
    to_end = [
        observer.run_ended[n] - observer.pod_ended[n] for n in names if n in observer.pod_ended
    ]
    rows = [
        row(f"created -> pod ({runs} at once{', kubelet held' if kubelet else ''})", to_pod),
        row(f"pod done -> run terminal ({len(to_end)})", to_end),
        f"{'all ' + str(runs) + ' runs terminal after':<44} {wall:>9.1f} s",
    ]
    return rows


def row(label: str, seconds: list[float]) -> str:
    p50, p99 = percentile(seconds, 0.5), percentile(seconds, 0.99)
    return f"{label:<44} {p50 * 1000:>9.0f} ms  p99 {p99 * 1000:>8.0f} ms"


async def status_patches(api: kube.Client) -> float:
    text = await api.request_text("GET", "/metrics")
    total = 0.0
    for line in text.splitlines():
        wanted = ('resource="flowruns"', 'subresource="status"', 'verb="PATCH"')
        if line.startswith("apiserver_request_total{") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def bench_patches(api: kube.Client, ns: str, observer: Observer, runs: int) -> list[str]:
    counts = {}
    for nodes in (1, 6):
        name = f"patch{nodes}"
        await api.create(kube.path_of("flows", ns), flow(name, nodes))
        await asyncio.sleep(2)
        before = await status_patches(api)
        names = [f"{name}-{i:03d}" for i in range(runs)]
        await asyncio.gather(
            *(api.create(kube.path_of("flowruns", ns), flowrun(n, name)) for n in names)
        )
        await wait_until(lambda ns_=names: all(n in observer.run_ended for n in ns_), 600, name)
        await asyncio.sleep(3)  # the operator's last writes (completion, Flow status)
        counts[nodes] = (await status_patches(api) - before) / runs
    per_node = (counts[6] - counts[1]) / 5
    return [
        f"{'status PATCHes per run, 1-node flow':<44} {counts[1]:>9.1f}",
        f"{'status PATCHes per run, 6-node flow':<44} {counts[6]:>9.1f}",
        f"{'status PATCHes per node (marginal)':<44} {per_node:>9.1f}",
    ]


async def bench_memory(api: kube.Client, ns: str, pid: int, count: int) -> list[str]:
    idle, _ = memory(pid)
    names = [f"ghost-{i:05d}" for i in range(count)]
    started = time.perf_counter()
    await bounded(
        [
            lambda n=n: api.create(kube.path_of("flowruns", ns), flowrun(n, "no-such-flow"))
            for n in names
        ],
        16,
    )

    async def settled() -> int:
        listed = await api.get(kube.path_of("flowruns", ns))
        return sum(
            1
            for item in listed["items"]
            if item["metadata"]["name"].startswith("ghost-")
            and (item.get("status") or {}).get("phase") in TERMINAL
        )

    deadline = time.monotonic() + 900
    while (done := await settled()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {done} of {count} FlowRuns settled")
        await asyncio.sleep(2)
    settle = time.perf_counter() - started
    await asyncio.sleep(5)
    rss, peak = memory(pid)
    return [
        f"{'operator RSS, idle':<44} {idle:>9.1f} MiB",
        f"{f'operator RSS, {count} FlowRuns present':<44} {rss:>9.1f} MiB  peak {peak:.1f} MiB",
        f"{f'{count} FlowRuns created and Failed in':<44} {settle:>9.1f} s",
    ]


async def main_async(args: argparse.Namespace, kubeconfig: str, workdir: Path) -> list[str]:
    ns = f"bench-operator-{os.getpid()}"
    install(kubeconfig, ns)
    op_kubeconfig = operator_kubeconfig(kubeconfig, workdir)
    observer = Observer()
    rows: list[str] = []
    with operator_process(op_kubeconfig, workdir / "operator.log") as process:
        async with kube.Client.from_env(kubeconfig, retry_seconds=30) as api:
            watchers = [
                asyncio.ensure_future(
                    watch_forever(
                        api, kube.path_of("pods", ns), observer.pod,
                        labelSelector="agentflows.io/run",
                    )
                ),
                asyncio.ensure_future(
                    watch_forever(api, kube.path_of("flowruns", ns), observer.run)
                ),
            ]  # fmt: skip
            try:
                rows += await bench_latency(api, ns, observer, args.runs, kubelet_pid(kubeconfig))
                rows += await bench_patches(api, ns, observer, args.patch_runs)
                rows += await bench_memory(api, ns, process.pid, args.settle)
            finally:
                for task in watchers:
                    task.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="An admin kubeconfig (default: a private cluster).")
    parser.add_argument("--runs", type=int, default=100, help="FlowRuns created at once.")
    parser.add_argument("--patch-runs", type=int, default=10, help="Runs per patch batch.")
    parser.add_argument("--settle", type=int, default=2000, help="FlowRuns for the RSS figure.")
    parser.add_argument("--quick", action="store_true", help="20 runs, 200 FlowRuns.")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.patch_runs, args.settle = 20, 5, 200
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp,
        cluster(args.kubeconfig) as kubeconfig,
    ):
        rows = asyncio.run(main_async(args, kubeconfig, Path(tmp)))
    print(f"{'measure':<44} {'p50 / value':>9}")
    print("-" * 78)
    for line in rows:
        print(line)
    print(f"(bench wall time {time.perf_counter() - started:.0f} s, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
