"""``agentflows console``: serve the web console for a cluster, or for local runs.

On a cluster the console acts as each user (see :mod:`agentflows.console.identity`): behind an
authenticating proxy with ``--trust-proxy-from``, with users' own tokens with
``--pass-tokens``, or else as the kubeconfig's user — then only on loopback, since whoever
reaches it would act as that user. ``--local`` shows the runs of the state directory instead
and resumes them with ``agentflows resume``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import sys
from typing import Any

import click

from agentflows.cli import commands_cluster, group, local, local_runs, run_lock

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _network(value: str | None) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if value is None:
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an address or network (e.g. 10.0.0.5/32 or 10.0.0.0/24)",
            param_hint="--trust-proxy-from",
        ) from None


def _local_runs(state_dir: str | None) -> Any:
    from agentflows.console import local_pages

    directory = local.state_dir(state_dir)
    return local_pages.LocalRuns(
        directory=directory,
        read_all=lambda: local_runs.read_all(directory),
        read=lambda name: local_runs.read(directory, name),
        flows=lambda name: local_runs.flows(directory, name),
        changed_at=lambda name: local_runs.changed_at(directory, name),
        name_problem=_run_name_problem,
        owner=lambda name: run_lock.holder(directory, name),
        resume_command=[sys.executable, "-m", "agentflows.cli.main", "resume"],
        decided_by=os.environ.get("USER", "local"),
    )


def _run_name_problem(name: str) -> str | None:
    try:
        local.check_run_name(name)
    except local.UsageError as exc:
        return str(exc)
    return None


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, help="Port to listen on.")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace the pages show first (default: the kubeconfig's); repeat it to name where "
    "the runs of users who may not list them cluster-wide are looked for.",
)
@commands_cluster.kubeconfig_option
@commands_cluster.context_option
@click.option(
    "--trust-proxy-from",
    metavar="CIDR",
    help="Believe X-Forwarded-User/-Groups from this network only (an authenticating proxy).",
)
@click.option(
    "--allow-system-identity",
    "allowed_system",
    multiple=True,
    metavar="NAME",
    help="A system: user or group (system:serviceaccount:NS:NAME, system:masters...) the "
    "console may act for when its proxy forwards it; repeat it. Default: none.",
)
@click.option("--pass-tokens", is_flag=True, help="Act with the bearer token each request sends.")
@click.option("--local", "local_mode", is_flag=True, help="Show the runs of the state directory.")
@click.option("--state-dir", help="Where local runs are kept (with --local).")
@click.option(
    "--webhook-url",
    metavar="URL",
    default="",
    help="Where the webhook receiver is reached (the Flows page shows trigger URLs under it).",
)
def console(
    host: str,
    port: int,
    namespaces: tuple[str, ...],
    kubeconfig: str | None,
    kube_context: str | None,
    trust_proxy_from: str | None,
    allowed_system: tuple[str, ...],
    pass_tokens: bool,
    local_mode: bool,
    state_dir: str | None,
    webhook_url: str,
) -> None:
    """Serve the web console: runs, flows and the requests inbox, acting as each user."""
    from agentflows.console import app, identity

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    proxy = _network(trust_proxy_from)
    if host not in LOOPBACK and proxy is None and not pass_tokens:
        raise click.BadParameter(
            f"{host!r}: without --trust-proxy-from or --pass-tokens the console acts as your "
            "own user, so it listens on loopback only (127.0.0.1 or ::1)",
            param_hint="--host",
        )
    if local_mode:
        web_app = app.local_app(_local_runs(state_dir))
    else:
        api = commands_cluster._client(kubeconfig, kube_context)
        gate = identity.Gate(
            api, trusted_proxy=proxy, pass_tokens=pass_tokens, allowed_system=allowed_system
        )
        web_app = app.cluster_app(
            gate,
            namespaces[0] if namespaces else api.config.namespace,
            webhook_url=webhook_url,
            namespaces=namespaces,
        )
    with group.listening("--port", port, host):
        asyncio.run(app.serve(web_app, host, port))


COMMANDS = [console]
