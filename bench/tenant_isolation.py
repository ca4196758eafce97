"""Tenant isolation on the dev control plane: another tenant's run latency during each attack.

Run ``python bench/tenant_isolation.py --quick`` (a few minutes on 2 shared cores) or without
``--quick`` (1,000 runs in the flood). It starts a private control plane (hack/devcluster) or
uses the cluster of ``--kubeconfig`` (admin), installs crds/ and config/ as they ship, and runs
``agentflows operator`` with its ServiceAccount's token (bench/operator_cluster.py). team-a
runs one one-node run at a time; its ``created -> Succeeded`` (the create call returning to the
bench seeing the phase, polled every 50 ms) is measured alone and while team-b attacks:

- ``flood``: ``flood`` FlowRuns created in team-b at once (the work queue's namespace turns);
- ``large inputs``: ``large`` FlowRuns of 1.2 MB ``spec.input`` (each fails at once,
  InputTooLarge, and leaves the operator's cache);
- ``trigger loop``: a team-b Flow whose kubernetes trigger watches its namespace's FlowRun
  Events, seeded with one run (its own runs' Events are refused: the bench prints how many runs
  the Flow got).

Slow-connection floods against the webhook receiver are bounded per source address
(``max_connections_per_peer``), tested in tests/unit/security/test_attack_webhook.py. Not a test:
it asserts nothing and is bounded by timeouts.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import operator_cluster as oc
from agentflows.kube import client as kube

TEAM_A, TEAM_B = "team-a", "team-b"


async def phase(api: kube.Client, namespace: str, name: str) -> str:
    run = await api.get(kube.path_of("flowruns", namespace, name))
    return str((run.get("status") or {}).get("phase") or "")


async def one_run(api: kube.Client, name: str) -> float:
    """Seconds from team-a's create call returning to the bench seeing the run terminal."""
    await api.create(kube.path_of("flowruns", TEAM_A), oc.flowrun(name, "one"))
    created = time.monotonic()
    deadline = created + 600
    while (seen := await phase(api, TEAM_A, name)) not in oc.TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not terminal after 600 s")
        await asyncio.sleep(0.05)
    if seen != "Succeeded":
        raise RuntimeError(f"{name} ended {seen}")
    return time.monotonic() - created


async def team_a(
    api: kube.Client, label: str, runs: int, alone: float | None = None
) -> tuple[str, float]:
    """team-a's p50 during ``label`` (seconds), with its ratio to ``alone`` (no attack)."""
    prefix = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")  # a run name
    seconds = [await one_run(api, f"{prefix}-{i}") for i in range(runs)]
    p50 = oc.percentile(seconds, 0.5)
    line = f"team-a created -> Succeeded during {label}: p50 {round(p50 * 1000)} ms"
    if alone:
        line += f" ({p50 / alone:.2f}x alone)"
    oc.progress(line)
    return line, p50


async def create_many(api: kube.Client, bodies: list[dict[str, Any]]) -> None:
    path = kube.path_of("flowruns", TEAM_B)
    jobs: list[Callable[[], Awaitable[Any]]] = [
        functools.partial(api.create, path, body) for body in bodies
    ]
    await oc.bounded(jobs, 16)


def loop_flow() -> dict[str, Any]:
    flow = oc.flow("loop", 1)
    trigger = {
        "name": "runs",
        "kubernetes": {
            "apiVersion": "v1",
            "kind": "Event",
            "fieldSelector": "involvedObject.kind=FlowRun",
        },
    }
    flow["spec"]["triggers"] = [trigger]
    return flow


async def measure(api: kube.Client, quick: bool) -> list[str]:
    samples = 3 if quick else 10
    flood = 50 if quick else 1000
    large = 10 if quick else 40
    line, alone = await team_a(api, "alone", samples)
    lines = [line]
    await create_many(api, [oc.flowrun(f"flood-{i}", "one") for i in range(flood)])
    lines.append((await team_a(api, f"flood of {flood} runs", samples, alone))[0])
    big = {"document": "a" * 1_200_000}
    bodies = [
        {**oc.flowrun(f"large-{i}", "one"), "spec": {"flow": "one", "input": big}}
        for i in range(large)
    ]
    await create_many(api, bodies)
    lines.append((await team_a(api, f"{large} runs of 1.2 MB input", samples, alone))[0])
    await api.create(kube.path_of("flows", TEAM_B), loop_flow())
    await asyncio.sleep(2)  # the trigger's watch starts (a bench: no condition to wait on)
    await api.create(kube.path_of("flowruns", TEAM_B), oc.flowrun("seed", "loop"))
    lines.append((await team_a(api, "trigger loop", samples, alone))[0])
    # by spec.flow, not the agentflows.io/flow label: the operator labels a run when it admits
    # it, and team-b's runs may still wait for their turn
    listing = await api.get(kube.path_of("flowruns", TEAM_B))
    looped = [r for r in listing["items"] if (r.get("spec") or {}).get("flow") == "loop"]
    lines.append(f"runs of the looping Flow (seed included): {len(looped)}")
    return lines


async def main(kubeconfig: str, operator_config: Path, log: Path, quick: bool) -> list[str]:
    operator = oc.Operator(operator_config, log)
    with oc.running(operator):
        await operator.serving()
        async with kube.Client.from_env(kubeconfig) as api:
            for namespace in (TEAM_A, TEAM_B):
                await api.create(kube.path_of("flows", namespace), oc.flow("one", 1))
            await asyncio.sleep(2)  # both Flows validated (a bench: no condition to wait on)
            return await measure(api, quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 samples, a flood of 50 runs")
    parser.add_argument("--kubeconfig", help="use this cluster (admin) instead of a private one")
    args = parser.parse_args()
    with oc.cluster(args.kubeconfig) as cluster, tempfile.TemporaryDirectory() as work:
        oc.install(cluster.kubeconfig)
        for namespace in (TEAM_A, TEAM_B):
            oc.add_namespace(cluster.kubeconfig, namespace)
        config = oc.operator_kubeconfig(cluster.kubeconfig, Path(work))
        figures = asyncio.run(
            main(cluster.kubeconfig, config, Path(work) / "operator.log", args.quick)
        )
    print("\n".join(figures))
