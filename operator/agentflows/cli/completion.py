"""Shell completion of run names (click's ``shell_complete``), for every command taking RUN.

``resume`` completes the runs of the state directory; cluster commands (``approve``, ``watch``,
...) the FlowRuns of the namespace (``-n`` when typed before RUN, else the kubeconfig's); ``get``
both, unless ``--local``/``--state-dir`` was typed. A cluster that does not answer within
:data:`_CLUSTER_SECONDS` adds nothing. Enabling completion in a shell: see the README.
"""

from __future__ import annotations

import asyncio

import click
from click import shell_completion

from agentflows.cli import local, local_runs

#: How long a completion may wait for the API server.
_CLUSTER_SECONDS = 3.0
#: Commands whose RUN is a local run.
_LOCAL_COMMANDS = frozenset({"resume", "get"})


def run_names(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[shell_completion.CompletionItem]:
    """Run names starting with ``incomplete``."""
    params = ctx.params
    names: set[str] = set()
    if ctx.command.name in _LOCAL_COMMANDS:
        names |= set(local_runs.names(local.state_dir(params.get("state_dir"))))
    if ctx.command.name != "resume" and not (params.get("local_only") or params.get("state_dir")):
        names |= _cluster_names(
            params.get("namespace"), params.get("kubeconfig"), params.get("kube_context")
        )
    return [shell_completion.CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


def _cluster_names(
    namespace: str | None, kubeconfig: str | None, kube_context: str | None
) -> set[str]:
    """FlowRun names of a namespace, or none when the cluster cannot answer quickly."""
    from agentflows.cli import requests as requests_mod
    from agentflows.kube import client as kube
    from agentflows.kube import kubeconfig as kubeconfig_mod

    async def listed() -> set[str]:
        api = kube.Client.from_env(kubeconfig, kube_context, retry_seconds=0)
        async with api:
            runs = await requests_mod.list_runs(api, namespace or api.config.namespace, None)
        return {r["metadata"]["name"] for r in runs}

    try:
        return asyncio.run(asyncio.wait_for(listed(), _CLUSTER_SECONDS))
    except (kube.ApiError, kubeconfig_mod.ConfigError, OSError, ValueError, TimeoutError):
        # a completion has nowhere to report a problem: it offers what it could find
        return set()
