"""``list``, ``get`` and ``requests``: runs and their pending requests, local or on a cluster.

Where they look (one rule, :func:`is_local`):

- ``--local`` or ``--state-dir DIR``: the local state directory;
- ``-n/--namespace``, ``-A/--all-namespaces``, ``--kubeconfig`` or ``--context``: the cluster;
- neither: ``get RUN`` looks locally when the state directory holds RUN, ``list`` and
  ``requests`` when the state directory exists; otherwise the cluster.

Local runs are shown as the FlowRuns a cluster would hold (:mod:`agentflows.cli.local_runs`), so
every ``-o`` format prints the same shapes in both places (:mod:`agentflows.cli.views`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from agentflows.cli import commands_cluster, completion, group, local, local_runs, views

local_option = click.option(
    "--local", "local_only", is_flag=True, help="Local runs (the state directory), not the cluster."
)
state_dir_option = click.option(
    "--state-dir",
    help="Directory of local runs (default: $AGENTFLOWS_STATE_DIR or .agentflows/runs).",
)
all_namespaces_option = click.option(
    "-A", "--all-namespaces", is_flag=True, help="On a cluster: every namespace."
)


def _listing_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options of list and requests: which runs, where to look, how to print them."""
    for option in reversed(
        (
            click.option("--flow", help="Only runs of this Flow."),
            views.output_option(),
            local_option,
            state_dir_option,
            all_namespaces_option,
            commands_cluster.namespace_option,
            commands_cluster.kubeconfig_option,
            commands_cluster.context_option,
        )
    ):
        command = option(command)
    return command


def _usage(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(group.EXIT_INVALID)


def is_local(
    params: dict[str, Any], found_locally: Callable[[Path], bool], missing: str
) -> tuple[bool, Path, str | None]:
    """Whether to look at local runs, and where they are.

    The third value is set when the cluster was chosen for want of local runs: ``missing``
    and the directory, for an error message if the cluster cannot be reached either.
    """
    directory = local.state_dir(params.get("state_dir"))
    wants_local = bool(params.get("local_only") or params.get("state_dir"))
    wants_cluster = bool(
        params.get("namespace")
        or params.get("all_namespaces")
        or params.get("kubeconfig")
        or params.get("kube_context")
    )
    if wants_local and wants_cluster:
        _usage(
            "--local/--state-dir and -n/-A/--kubeconfig/--context name different places; give one"
        )
    if wants_local or wants_cluster:
        return wants_local, directory, None
    here = found_locally(directory)
    return here, directory, None if here else f"{missing} in {directory}"


def _local_runs(directory: Path, flow: str | None) -> list[dict[str, Any]]:
    """The local runs (of ``flow``), with a warning on stderr for each unreadable one."""
    runs, problems = local_runs.read_all(directory)
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    return [r for r in runs if not flow or r["spec"]["flow"] == flow]


def _read_local(directory: Path, name: str) -> dict[str, Any]:
    try:
        run = local_runs.read(directory, name)
    except local_runs.StateError as exc:
        _usage(str(exc))
    if run is None:
        _usage(
            f"no local run {name} in {directory} (runs there: {len(local_runs.names(directory))})"
        )
    return run  # type: ignore[return-value]


@click.command()
@click.argument("run_name", shell_complete=completion.run_names)
@views.output_option()
@local_option
@state_dir_option
@commands_cluster.namespace_option
@commands_cluster.kubeconfig_option
@commands_cluster.context_option
def get(
    run_name: str,
    output: str,
    local_only: bool,
    state_dir: str | None,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Show a run: phase, every node, requests and outputs (offloaded ones included).

    A local run with --local or --state-dir, or when the state directory holds RUN; else the
    cluster's (-n, --kubeconfig, --context choose it explicitly).
    """
    params = click.get_current_context().params
    here, directory, missing = is_local(
        params, lambda d: local.is_run(d, run_name), f"no local run {run_name}"
    )
    if here:
        click.echo(views.render_run(_read_local(directory, run_name), output))
        return
    commands_cluster.get_from_cluster(
        run_name, output, namespace, kubeconfig, kube_context, missing
    )


@click.command("list")
@_listing_options
def list_command(
    flow: str | None,
    output: str,
    local_only: bool,
    state_dir: str | None,
    all_namespaces: bool,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """List runs with the columns of kubectl get flowruns (-o wide: reason, requests, message).

    Local runs with --local or --state-dir, or when the state directory exists; else the
    cluster's (-n, -A, --kubeconfig, --context choose it explicitly).
    """
    here, directory, missing = is_local(
        click.get_current_context().params, Path.is_dir, "no local runs"
    )
    if here:
        runs = _local_runs(directory, flow)
        where = f"in {directory}"
    else:
        runs, where = commands_cluster.runs_from_cluster(
            flow, all_namespaces, namespace, kubeconfig, kube_context, missing
        )
    if not runs and output not in ("json", "yaml"):
        click.echo(f"No runs {where}.", err=True)
        return
    click.echo(views.render_runs(runs, output, namespaces=all_namespaces))


@click.command()
@_listing_options
def requests(
    flow: str | None,
    output: str,
    local_only: bool,
    state_dir: str | None,
    all_namespaces: bool,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """List pending human requests: flow, run, request, kind, message, summary and age.

    Where it looks: as for list. -o name prints RUN REQUEST lines (for xargs -n2 agentflows
    approve on a cluster).
    """
    here, directory, missing = is_local(
        click.get_current_context().params, Path.is_dir, "no local runs"
    )
    if here:
        runs = _local_runs(directory, flow)
        where = f"in {directory}"
    else:
        runs, where = commands_cluster.runs_from_cluster(
            flow, all_namespaces, namespace, kubeconfig, kube_context, missing
        )
    items = views.request_items(runs)
    if not items and output not in ("json", "yaml"):
        click.echo(f"No pending requests {where}.", err=True)
        return
    click.echo(views.render_requests(items, output, namespaces=all_namespaces))


COMMANDS = [get, list_command, requests]
