"""Click commands that work on a cluster: start, get, watch, logs.

Registered on the ``agentflows`` group by :mod:`agentflows.cli.main`; the HTTP client and the
kube modules are imported when a command runs, not when the CLI starts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from agentflows.cli import local

namespace_option = click.option(
    "-n", "--namespace", default=None, help="Namespace (default: the kubeconfig's)."
)
kubeconfig_option = click.option(
    "--kubeconfig", default=None, help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config)."
)


def _client(kubeconfig: str | None) -> Any:
    from agentflows.kube import client as kube

    try:
        return kube.Client.from_env(kubeconfig, retry_seconds=10)
    except (kube.ApiError, OSError, KeyError, StopIteration) as exc:
        click.echo(f"error: cannot load a kubeconfig: {exc}", err=True)
        sys.exit(2)


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


@click.command()
@click.argument("flow")
@click.option("--input", "inputs", multiple=True, metavar="KEY=VALUE", help="Input field.")
@click.option("--input-json", help="The whole input as JSON.")
@click.option("--name", help="Run name (default: <flow>-<random>).")
@click.option("--wait", is_flag=True, help="Wait until the run ends or waits, and print it.")
@click.option("--timeout", default=3600.0, help="Seconds to wait with --wait.")
@namespace_option
@kubeconfig_option
def start(
    flow: str,
    inputs: tuple[str, ...],
    input_json: str | None,
    name: str | None,
    wait: bool,
    timeout: float,
    namespace: str | None,
    kubeconfig: str | None,
) -> None:
    """Start a run of FLOW in the cluster (a FlowRun); print its name."""
    from agentflows.cli import cluster
    from agentflows.kube import client as kube

    try:
        value = local.parse_inputs(inputs, input_json)
    except local.UsageError as exc:
        _fail(exc)
    api = _client(kubeconfig)
    ns = namespace or api.config.namespace

    async def go() -> int:
        async with api:
            try:
                run = await cluster.start(api, ns, flow, value, name=name)
            except kube.ApiError as exc:
                _fail(exc)
            run_name = run["metadata"]["name"]
            click.echo(run_name)
            if not wait:
                return 0
            last: dict[str, Any] = run
            async for seen in cluster.follow(api, ns, run_name, give_up_after=timeout):
                last = seen
            status = await cluster.resolve_outputs(api, ns, last)
            click.echo(json.dumps(cluster.summary(last, status), indent=2, ensure_ascii=False))
            return cluster.exit_code(status.get("phase"))

    sys.exit(cluster.run_async(go()))


@click.command()
@click.argument("run_name")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table")
@namespace_option
@kubeconfig_option
def get(run_name: str, output: str, namespace: str | None, kubeconfig: str | None) -> None:
    """Show a run: phase, every node, requests and outputs (offloaded ones included)."""
    from agentflows.cli import cluster
    from agentflows.kube import client as kube

    api = _client(kubeconfig)
    ns = namespace or api.config.namespace

    async def go() -> None:
        async with api:
            try:
                run = await cluster.get_run(api, ns, run_name)
                status = await cluster.resolve_outputs(api, ns, run)
            except kube.ApiError as exc:
                _fail(exc)
            info = cluster.summary(run, status)
            if output == "json":
                click.echo(json.dumps(info, indent=2, ensure_ascii=False))
            else:
                click.echo(cluster.render_table(info))

    cluster.run_async(go())


@click.command()
@click.argument("run_name")
@click.option("--timeout", default=3600.0, help="Give up after this many seconds.")
@namespace_option
@kubeconfig_option
def watch(run_name: str, timeout: float, namespace: str | None, kubeconfig: str | None) -> None:
    """Follow a run live: a line per node change, until it ends or waits."""
    from agentflows.cli import cluster
    from agentflows.kube import client as kube

    api = _client(kubeconfig)
    ns = namespace or api.config.namespace

    async def go() -> int:
        async with api:
            before: dict[str, Any] = {"metadata": {"name": run_name}}
            phase = None
            try:
                async for run in cluster.follow(api, ns, run_name, give_up_after=timeout):
                    for line in cluster.node_changes(before, run):
                        click.echo(line)
                    before = run
                    phase = (run.get("status") or {}).get("phase")
            except kube.ApiError as exc:
                _fail(exc)
            return cluster.exit_code(phase)

    sys.exit(cluster.run_async(go()))


@click.command()
@click.argument("run_name")
@click.option("--attempt", type=int, default=None, help="Attempt (default: the current one).")
@namespace_option
@kubeconfig_option
def logs(run_name: str, attempt: int | None, namespace: str | None, kubeconfig: str | None) -> None:
    """Print the runner pod's log of a run."""
    from agentflows.cli import cluster
    from agentflows.kube import client as kube

    api = _client(kubeconfig)
    ns = namespace or api.config.namespace

    async def go() -> None:
        async with api:
            try:
                click.echo(await cluster.logs(api, ns, run_name, attempt), nl=False)
            except kube.ApiError as exc:
                _fail(exc)

    cluster.run_async(go())


COMMANDS = [start, get, watch, logs]
