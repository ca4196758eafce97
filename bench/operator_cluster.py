"""What bench/operator_scale.py stands on: the cluster, the operator process, watches, /proc.

Imported by ``operator_scale.py`` and ``operator_failover.py`` (scripts run beside it, so this
directory is on ``sys.path``). Nothing here measures: it starts a private control plane (with
the API server's audit log, hack/devcluster) or uses a given one, installs the operator's CRDs,
RBAC and policies as they ship, runs ``agentflows operator`` as a subprocess with its
ServiceAccount's token, holds and de-prioritises the process kubelet's pods, reads a process's
CPU time and memory from /proc, and records the bench's own receipt times of watch events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from agentflows.kube import client as kube

REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"Succeeded", "Failed", "Cancelled"}
OPERATOR = ("agentflows-system", "agentflows-operator")
OPERATOR_USER = f"system:serviceaccount:{OPERATOR[0]}:{OPERATOR[1]}"
RUNNER_ACCOUNT = "agentflows-runner"
#: The label the operator puts on runner pods, and the one the peer puts on its pods.
RUN_LABELS = ("agentflows.io/run", "bench.agentflows.io/run")


def runner_user(namespace: str) -> str:
    """The user name of runner pods' tokens in ``namespace``."""
    return f"system:serviceaccount:{namespace}:{RUNNER_ACCOUNT}"


@dataclasses.dataclass
class Cluster:
    """An admin kubeconfig, and what the bench may do to the machine the cluster runs on."""

    kubeconfig: str
    #: The API server's audit log (None: the cluster writes none).
    audit_log: Path | None
    #: The process kubelet's pid (a hack/devcluster cluster), which the bench may stop.
    kubelet: int | None
    #: The bench started the cluster, so it may renice the kubelet (which cannot be undone).
    private: bool


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Iterator[Cluster]:
    """The given cluster (its audit log if hack/control-plane wrote one), or a private one."""
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import controlplane

    if kubeconfig:
        state_dir = Path(kubeconfig).resolve().parent
        audit = controlplane.audit_log(state_dir)
        pid_file = state_dir / "run" / "kubelet.pid"
        kubelet = int(pid_file.read_text()) if pid_file.exists() else None
        yield Cluster(kubeconfig, audit if audit.exists() else None, kubelet, private=False)
        return
    state_dir = controlplane.temporary_state_dir()
    # the process kubelet: the figures are the operator's, and a test session's real node may be up
    plane = controlplane.start(state_dir, audit=True, node_kind="process")
    try:
        audit = controlplane.audit_log(state_dir)
        yield Cluster(str(plane.kubeconfig("admin")), audit, plane.pids["kubelet"], private=True)
    finally:
        controlplane.stop(state_dir)


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        text=True,
        check=False,
        capture_output=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def progress(*lines: str) -> None:
    """Lines on stderr, so a long run shows where it is and what it found so far.

    stdout holds only the figures, printed once at the end.
    """
    for line in lines:
        print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- installing -------------------------------------------------------------------------------


def install(kubeconfig: str) -> None:
    """CRDs, the operator's namespace, RBAC and policies, as they ship."""
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl(kubeconfig, "apply", "-f", str(REPO / "config/manager/namespace.yaml"))
    kubectl(kubeconfig, "apply", "-k", str(REPO / "config/rbac"))
    kubectl(kubeconfig, "apply", "-k", str(REPO / "config/policies"))


def add_namespace(kubeconfig: str, namespace: str, runner: bool = True) -> None:
    """Create ``namespace``, with the runner's ServiceAccount, Role and binding when ``runner``."""
    kubectl(kubeconfig, "create", "namespace", namespace)
    if not runner:
        return
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
    context = {"cluster": entry["name"], "user": account, "namespace": namespace}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [{"name": account, "user": {"token": token.strip()}}],
        "contexts": [{"name": "op", "context": context}],
        "current-context": "op",
    }
    path = directory / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# --- the operator process ---------------------------------------------------------------------


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), ""
    except OSError:
        return 0, ""  # not listening yet


def metric(text: str, name: str, **labels: str) -> float | None:
    """The sum of the samples of ``name`` whose labels include ``labels`` (None: no sample)."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    found = None
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(w in line for w in wanted):
            found = (found or 0.0) + float(line.rsplit(" ", 1)[1])
    return found


class Operator:
    """``agentflows operator`` as a subprocess (its own session), with a metrics port."""

    def __init__(self, kubeconfig: Path, log: Path, name: str = "operator", *extra: str) -> None:
        self.port = free_port()
        env = {**os.environ, "AGENTFLOWS_RUNNER_IMAGE": "agentflows:bench"}
        env.pop("KUBECONFIG", None)
        # What a Deployment's downward API gives a pod; a leader-electing operator names itself
        # by them (and the bench finds the leader by them).
        env.update({"POD_NAME": name, "POD_NAMESPACE": OPERATOR[0]})
        argv = [sys.executable, "-m", "agentflows.cli.main", "operator"]
        argv += ["--kubeconfig", str(kubeconfig), "--metrics-port", str(self.port), *extra]
        self.name = name
        self.log = log
        self.started = time.monotonic()
        with log.open("ab") as output:
            self.process = subprocess.Popen(
                argv, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.pid = self.process.pid

    def metrics(self) -> str:
        """The /metrics text ("": not served yet)."""
        status, body = _http_get(f"http://127.0.0.1:{self.port}/metrics")
        return body if status == 200 else ""

    def readyz(self) -> bool | None:
        """True/False: /readyz says ready or not; None: the operator serves no /readyz.

        prometheus_client's server answers every path with the metrics text, so a 200 that is
        metrics text means "no /readyz", not "ready".
        """
        status, body = _http_get(f"http://127.0.0.1:{self.port}/readyz")
        if status == 200 and "# HELP" not in body and "# TYPE" not in body:
            return True
        if status in (200, 404):
            return None
        return False  # not listening yet, or not ready

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"the operator exited with {self.process.returncode}; see {self.log}"
            )

    async def serving(self, seconds: float = 60) -> None:
        """Wait until the metrics port answers."""
        deadline = time.monotonic() + seconds
        while True:
            self.check_alive()
            if await asyncio.to_thread(self.metrics):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator served no /metrics in {seconds}s; see {self.log}")
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a node failure or the OOM killer ends a pod."""
        self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def running(operator: Operator) -> Iterator[Operator]:
    try:
        yield operator
    finally:
        operator.stop()


# --- /proc ------------------------------------------------------------------------------------


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is field 3 of proc(5) (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The cgroup (v1 cpu controller) the runner processes of the bench's own cluster run in.
RUNNERS_CGROUP = Path("/sys/fs/cgroup/cpu") / f"agentflows-bench-runners-{os.getpid()}"


def release_runners_cgroup() -> None:
    """Remove the runners' cgroup once the cluster (its kubelet and runners) is gone."""
    with contextlib.suppress(OSError):
        RUNNERS_CGROUP.rmdir()


class Kubelet:
    """The process kubelet of the bench's own cluster (None on another's: then a no-op)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def lower_pods_priority(self) -> str:
        """Give the runner processes the kubelet starts only the CPU nothing else wants.

        Runner pods are local processes here; in a real cluster they run on other nodes. The
        kubelet's threads are reniced to 19 and, where the cgroup v1 cpu controller is writable,
        moved into a cgroup of its own with the smallest ``cpu.shares``; the runners inherit
        both. Nice alone does not hold at 100 runners at once: CFS weighs each task, and 100
        tasks at nice 19 (weight 15 each) outweigh the API server at nice 0 (1024). A cgroup is
        weighed as one. Returns how the runners were held back, for the bench's output.
        """
        if self.pid is None:
            return "not held back (a cluster the bench did not start)"
        tasks = [int(task.name) for task in Path(f"/proc/{self.pid}/task").iterdir()]
        for tid in tasks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PROCESS, tid, 19)
        try:
            RUNNERS_CGROUP.mkdir(exist_ok=True)
            (RUNNERS_CGROUP / "cpu.shares").write_text("2")
            for tid in tasks:
                with contextlib.suppress(ProcessLookupError):
                    (RUNNERS_CGROUP / "tasks").write_text(str(tid))
        except OSError:
            return "nice 19 (no writable cgroup cpu controller)"
        return f"nice 19 in cgroup {RUNNERS_CGROUP} with cpu.shares 2"

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """SIGSTOP the kubelet: pods are created but none is bound or started until the end."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            if self.pid is not None:
                os.kill(self.pid, signal.SIGCONT)


# --- watching ---------------------------------------------------------------------------------


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
        except (kube.ApiError, httpx.HTTPError):
            await asyncio.sleep(0.5)


class Observer:
    """Receipt times (``time.monotonic``) of what the bench's watches see, by run name.

    One clock, one process: every latency is the difference of two receipts here.
    """

    def __init__(self) -> None:
        self.pod_added: dict[str, float] = {}
        self.pod_ended: dict[str, float] = {}
        self.result_seen: dict[str, float] = {}
        self.run_ended: dict[str, float] = {}
        #: run -> uids of the pods seen for it, and its latest status.attempt
        self.pod_uids: dict[str, set[str]] = {}
        self.attempt: dict[str, int] = {}
        self.phase: dict[str, str] = {}

    def pod(self, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        labels = pod["metadata"].get("labels") or {}
        run = next((labels[key] for key in RUN_LABELS if key in labels), None)
        if run is None:
            return
        self.pod_added.setdefault(run, now)
        self.pod_uids.setdefault(run, set()).add(pod["metadata"]["uid"])
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.pod_ended.setdefault(run, now)

    def run(self, run: dict[str, Any]) -> None:
        now = time.monotonic()
        name = run["metadata"]["name"]
        status = run.get("status") or {}
        self.phase[name] = status.get("phase") or ""
        if isinstance(status.get("attempt"), int):
            self.attempt[name] = status["attempt"]
        if status.get("result"):
            self.result_seen.setdefault(name, now)
        if status.get("phase") in TERMINAL:
            self.run_ended.setdefault(name, now)

    def pod_done(self, name: str) -> float | None:
        """When the bench first saw that the run's runner is done (None: not yet).

        The first of: its pod phase Succeeded/Failed (pod watch), the runner's ``result`` in the
        run's status (FlowRun watch), the run turning terminal (FlowRun watch). The operator may
        finish a run from its ``result`` before the kubelet reports the pod ended: measured from
        the pod alone, "pod done -> terminal" came out negative (-48 ms). The result always
        precedes the terminal phase on the FlowRun watch (events of one object arrive in
        resourceVersion order), and a run with no result turns terminal only after the operator
        saw its pod end, which the bench's own pod watch may see later still; so the
        terminal phase bounds it too, and the difference is never negative.
        """
        seen = [
            times[name]
            for times in (self.pod_ended, self.result_seen, self.run_ended)
            if name in times
        ]
        return min(seen) if seen else None

    def watch(self, api: kube.Client, namespace: str) -> list[asyncio.Future[None]]:
        """Start the pod and FlowRun watches of ``namespace``; cancel the futures to stop."""
        pods = watch_forever(
            api, kube.path_of("pods", namespace), self.pod, labelSelector=RUN_LABELS[0]
        )
        peer_pods = watch_forever(
            api, kube.path_of("pods", namespace), self.pod, labelSelector=RUN_LABELS[1]
        )
        runs = watch_forever(api, kube.path_of("flowruns", namespace), self.run)
        return [asyncio.ensure_future(job) for job in (pods, peer_pods, runs)]


async def stop_watching(watchers: list[asyncio.Future[None]]) -> None:
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)


# --- objects and waiting ----------------------------------------------------------------------


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
        await asyncio.sleep(0.05)
