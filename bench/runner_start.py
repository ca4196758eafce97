"""Runner cold start on loopback: process start -> first model request, peak RSS, API requests.

Run ``python bench/runner_start.py`` (about a minute on 2 cores) or ``--quick``. It uses the
cluster of ``--kubeconfig`` (admin), else starts a private control plane the way the cluster
tests do (hack/devcluster) and stops it afterwards. It installs crds/ and the runner's RBAC
(config/rbac/runner) in a fresh namespace, and for each of ``--runs`` rounds:

- **runner**: creates a FlowRun of a one-``llm``-node Flow with its snapshot ConfigMap and
  ``status.attempt``/``status.pod`` as the operator writes them, then starts the real
  ``agentflows runner`` console script with the environment the operator gives a pod
  (``AGENTFLOWS_ATTEMPT``, ``LITELLM_LOCAL_MODEL_COST_MAP``) and a kubeconfig holding a token
  of the runner's ServiceAccount. Measured: from just before the process is spawned to the
  scripted model server (tests/support/model_server.py, in this process) receiving the
  chat-completions request, both on this process's monotonic clock; and the process's peak
  RSS (GNU time's ``%M``). The run must end Succeeded.
- **runner, traced**: the same with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set to an OTLP/HTTP sink on
  loopback in this process (it answers 200 and counts the export requests): what turning
  tracing on costs the cold start (the OpenTelemetry SDK and exporter imports, the provider),
  and the whole process, whose exit waits for the spans' export.
- **peer**: ``python -c 'import litellm; litellm.completion(...)'`` against the same server,
  timed the same way: what a bare litellm script pays before its first request.

Runner, traced runner and peer alternate, so background load hits them alike. The (untraced)
runner's API requests are counted by the API server itself: a FlowSchema matching only the
runner's ServiceAccount (tests/support/api_counts.py) and
``apiserver_flowcontrol_dispatched_requests_total`` of that schema, read before and after each
untraced runner. The last lines can be read by a script::

    runner start -> first model request p50 N ms
    runner RSS N MB
    runner API requests per run: N
    traced runner start -> first model request p50 N ms
    traced runner process p50 N ms (untraced N ms)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import api_counts, model_server  # noqa: E402

from agentflows.api import runner as runner_spec  # noqa: E402
from agentflows.api import snapshot as snapshot_api  # noqa: E402
from agentflows.kube import client as kube  # noqa: E402

ACCOUNT = "agentflows-runner"
MODEL = "openai/scripted-model"
PEER = """
import sys
import litellm
litellm.completion(
    model="openai/scripted-model", api_base=sys.argv[1], api_key="not-needed",
    messages=[{"role": "user", "content": "Say hi"}], max_retries=0,
)
"""


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Iterator[Path]:
    """Yield an admin kubeconfig path: the given one, or a private control plane's."""
    if kubeconfig:
        yield Path(kubeconfig)
        return
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import controlplane

    state_dir = controlplane.temporary_state_dir()
    # the process kubelet: this measures the runner's start (a test session's real node may be up)
    plane = controlplane.start(state_dir, node_kind="process")
    try:
        yield plane.kubeconfig("admin")
    finally:
        controlplane.stop(state_dir)


def kubectl(admin: Path, *args: str) -> None:
    subprocess.run(
        ["kubectl", f"--kubeconfig={admin}", *args],
        check=True,
        capture_output=True,
        timeout=120,
    )


def install(admin: Path, namespace: str) -> None:
    """The CRDs, a namespace, and the runner's ServiceAccount and Role in it."""
    kubectl(admin, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl(admin, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl(admin, "create", "namespace", namespace)
    kubectl(admin, "apply", "-k", str(REPO / "config/rbac/runner"), "-n", namespace)


def flow(url: str) -> dict[str, Any]:
    """A Flow of one ``llm`` node calling the scripted server."""
    model = {"name": MODEL, "apiBase": url, "retries": 0, "timeoutSeconds": 10}
    return {
        "nodes": [{"id": "ask", "llm": {"model": model, "prompt": "Say hi"}}],
        "output": "=.nodes.ask.text",
    }


async def create_run(api: kube.Client, namespace: str, spec: dict[str, Any], volumes: Path) -> str:
    """A FlowRun with its snapshot and attempt 1, as the operator leaves it for the pod.

    The operator writes ``attempt``, ``pod``, ``startTime`` and ``snapshotDigest`` before it
    creates the pod (controller/runstate.py, ``reserve_attempt``); the kubelet puts the snapshot
    in the pod's ``run-configmaps`` volume, written here under ``volumes``.
    """
    name = f"bench-{uuid.uuid4().hex[:8]}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    obj = await api.create(
        kube.path_of("flowruns", namespace),
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "FlowRun",
            "metadata": {"name": name},
            "spec": {"flow": "f"},
        },
    )
    owner = {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "name": name,
        "uid": obj["metadata"]["uid"],
    }
    snapshot = {"flow": "f", "flows": {"f": spec}, "agents": {}}
    text = json.dumps(snapshot)
    await api.create(
        kube.path_of("configmaps", namespace),
        {
            "metadata": {"name": f"{name}-snapshot", "ownerReferences": [owner]},
            "data": {"snapshot.json": text},
        },
    )
    mounted = volumes / f"{name}-snapshot" / "snapshot.json"
    mounted.parent.mkdir(parents=True)
    mounted.write_text(text)
    status = {"attempt": 1, "pod": f"{name}-1", "phase": "Running", "startTime": now}
    status["snapshotDigest"] = snapshot_api.digest_of(text)
    await api.merge_patch(
        kube.path_of("flowruns", namespace, name, sub="status"), {"status": status}
    )
    return name


class OtlpSink:
    """An OTLP/HTTP endpoint on loopback that answers every export 200 and counts them."""

    def __init__(self) -> None:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.exports = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Run ``argv``; return (monotonic start, peak RSS in KiB).

    The peak comes from GNU time's ``wait4`` (``%M``), not ours: a child of this process would
    carry this process's own peak RSS, inherited across fork and exec, in its ``ru_maxrss``.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        started = time.monotonic()
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", rss.name, *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{argv[0]} exited {done.returncode}:\n{done.stderr[-2000:]}")
        return started, int(rss.read().split()[-1])


def first_request(server: model_server.ScriptedModelServer, since: int) -> float:
    """Monotonic time the server received the first request after ``since`` requests."""
    if len(server.requests) <= since:
        raise SystemExit("the model server received no request")
    return server.requests[since].received


async def runner_round(
    api: kube.Client,
    namespace: str,
    server: model_server.ScriptedModelServer,
    agentflows: str,
    env: dict[str, str],
) -> tuple[float, float, int]:
    """One runner process on a fresh run: (ms to the first model request, ms in all, KiB)."""
    name = await create_run(
        api, namespace, flow(server.url), Path(env[runner_spec.CONFIGMAPS_ROOT_ENV])
    )
    server.script(model_server.Reply.text("hi"))
    seen = len(server.requests)
    started, kib = await asyncio.to_thread(
        timed, [agentflows, "runner", "--namespace", namespace, "--flowrun", name], env
    )
    ended = time.monotonic()
    run = await api.get(kube.path_of("flowruns", namespace, name))
    phase = (run["status"].get("result") or {}).get("phase")
    if phase != "Succeeded":
        raise SystemExit(f"run {name} ended {phase}: {run['status']}")
    return (first_request(server, seen) - started) * 1000, (ended - started) * 1000, kib


async def bench(admin: Path, rounds: int, agentflows: str) -> None:
    namespace = f"bench-runner-{uuid.uuid4().hex[:6]}"
    install(admin, namespace)
    work = Path(tempfile.mkdtemp(prefix="runner-start-"))
    runner_config = api_counts.account_kubeconfig(
        admin, namespace, ACCOUNT, work / "runner.kubeconfig"
    )
    server = model_server.ScriptedModelServer().start()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "KUBECONFIG": str(runner_config),
        "AGENTFLOWS_ATTEMPT": "1",
        runner_spec.CONFIGMAPS_ROOT_ENV: str(work / "configmaps"),
    }
    # Timed as the image runs it: pip compiled its bytecode at install; never recompile each run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    sink = OtlpSink()
    traced = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
    runner_ms: list[float] = []
    runner_whole: list[float] = []
    traced_ms: list[float] = []
    traced_whole: list[float] = []
    traced_kib: list[int] = []
    peer_ms: list[float] = []
    runner_kib: list[int] = []
    peer_kib: list[int] = []
    async with kube.Client.from_env(str(admin)) as api:
        schema = await api_counts.install_schema(api, namespace, ACCOUNT, namespace)
        async with kube.Client.from_env(str(runner_config)) as runner_api:
            await api_counts.wait_until_counted(api, runner_api, namespace, schema)
        try:
            counted = 0
            # Not counted: the first run writes the bytecode caches, as pip does at install.
            await runner_round(api, namespace, server, agentflows, env)
            for _ in range(rounds):
                before = await api_counts.requests_of(api, schema)
                ms, whole, kib = await runner_round(api, namespace, server, agentflows, env)
                counted += await api_counts.requests_of(api, schema) - before
                runner_ms.append(ms)
                runner_whole.append(whole)
                runner_kib.append(kib)
                ms, whole, kib = await runner_round(api, namespace, server, agentflows, traced)
                traced_ms.append(ms)
                traced_whole.append(whole)
                traced_kib.append(kib)

                server.script(model_server.Reply.text("hi"))
                seen = len(server.requests)
                started, kib = await asyncio.to_thread(
                    timed, [sys.executable, "-c", PEER, server.url], env
                )
                peer_ms.append((first_request(server, seen) - started) * 1000)
                peer_kib.append(kib)
        finally:
            await api_counts.remove_schema(api, schema)
            await api.delete(kube.path_of("namespaces", None, namespace))
            server.stop()
            sink.stop()
    report(runner_ms, peer_ms, runner_kib, peer_kib, counted / rounds)
    if sink.exports < rounds:
        raise SystemExit(f"the traced runners exported {sink.exports} times in {rounds} rounds")
    print(f"  traced runner start -> first model request ms: {[round(v) for v in traced_ms]}")
    print(f"  traced runner RSS MB: {max(traced_kib) / 1024:.0f}")
    print(f"traced runner start -> first model request p50 {statistics.median(traced_ms):.0f} ms")
    print(
        f"traced runner process p50 {statistics.median(traced_whole):.0f} ms "
        f"(untraced {statistics.median(runner_whole):.0f} ms)"
    )


def report(
    runner_ms: list[float],
    peer_ms: list[float],
    runner_kib: list[int],
    peer_kib: list[int],
    requests: float,
) -> None:
    runner_p50 = statistics.median(runner_ms)
    peer_p50 = statistics.median(peer_ms)
    print(f"rounds: {len(runner_ms)}")
    print(f"  runner start -> first model request ms: {[round(v) for v in runner_ms]}")
    print(f"  litellm script start -> first model request ms: {[round(v) for v in peer_ms]}")
    print(f"  litellm script RSS MB: {max(peer_kib) / 1024:.0f}")
    print(
        f"ratio runner / litellm script (p50 start -> first request): {runner_p50 / peer_p50:.2f}"
    )
    print(f"runner start -> first model request p50 {runner_p50:.0f} ms")
    print(f"runner RSS {max(runner_kib) / 1024:.0f} MB")
    print(f"runner API requests per run: {requests:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="admin kubeconfig of a running cluster")
    parser.add_argument("--runs", type=int, default=7, help="rounds of runner and peer")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument(
        "--runner",
        default=str(Path(sys.executable).parent / "agentflows"),
        help="the agentflows console script to measure (another checkout's, to compare)",
    )
    args = parser.parse_args()
    with cluster(args.kubeconfig) as admin:
        asyncio.run(bench(admin, 3 if args.quick else args.runs, args.runner))


if __name__ == "__main__":
    main()
