"""``agentflows graph``: a picture of a Flow from files, or of a run as it ran.

- ``agentflows graph FILE... [--flow NAME]`` draws a Flow of the files, loaded and checked as
  ``agentflows run`` loads them (Agent Spec documents included), with its sub-flows inside.
- ``agentflows graph RUN -n NS`` draws a FlowRun of the cluster: the Flow of its snapshot
  ConfigMap ``<run>-snapshot`` (:mod:`agentflows.kube.snapshot`), so the picture is the Flow as
  the run ran it, not as it was edited since, with each node coloured by its phase in
  ``status.nodes`` and its duration. A run without a snapshot yet (still Pending), or one the
  caller may not read (a role without ConfigMaps), is drawn from its Flow as it is now, with a
  note on stderr saying so.
- ``agentflows graph RUN`` draws a local run (its ``<run>.snapshot.json``) when the state
  directory holds it, as ``agentflows get`` looks; ``--local``/``--state-dir`` insist on it.

Output (``-o``): ``mermaid`` (the default; paste it into a ```` ```mermaid ```` block on GitHub or
GitLab), ``dot`` (Graphviz), or ``svg`` (laid out by Graphviz's ``dot``, which must be
installed: without it the command exits 2 saying so). The pictures are
:mod:`agentflows.diagram`'s; this module only finds the Flow and the run.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import click

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import snapshot as snapshot_api
from agentflows.cli import commands_agentspec, commands_cluster, commands_runs, group, local
from agentflows.engine import graph

FORMATS = ("mermaid", "dot", "svg")


def _usage(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(group.EXIT_INVALID)


def _draw(
    spec: flow_api.FlowSpec,
    nodes: Mapping[str, Any] | None,
    flows: Mapping[str, flow_api.FlowSpec],
    output: str,
) -> None:
    from agentflows import diagram

    if output == "mermaid":
        text = diagram.mermaid(spec, nodes, flows=flows)
    elif output == "dot":
        text = diagram.dot(spec, nodes, flows=flows)
    else:
        try:
            text = diagram.svg(spec, nodes, flows=flows)
        except diagram.GraphvizMissing as exc:
            _usage(str(exc))
    click.echo(text, nl=False)


def _from_files(files: list[Path], flow_name: str | None, output: str) -> None:
    loaded = commands_agentspec.load_paths(files)
    problems = local.validate_loaded(loaded)
    if problems:
        for problem in problems:
            click.echo(str(problem), err=True)
        _usage(
            f"{len(problems)} problem(s) found (a Flow is drawn from files that validate, as "
            "for run: give the files of its Agents and sub-flows too)"
        )
    try:
        chosen = local.pick_flow(loaded, flow_name or commands_agentspec.flow_to_run(loaded))
    except local.UsageError as exc:
        _usage(str(exc))
    _draw(chosen.spec, None, local.resolver_of(loaded).flows, output)


def _from_local_run(directory: Path, name: str, output: str) -> None:
    from agentflows.cli import local_runs

    try:
        run = local_runs.read(directory, name)
        snapshot = local.SnapshotFile.load(local.snapshot_path(directory, name)).snapshot
        resolver = graph.StaticResolver.of_snapshot(snapshot)
    except (local_runs.StateError, OSError, ValueError, TypeError) as exc:
        _usage(f"cannot read run {name} in {directory}: {exc}")
    if run is None:
        _usage(f"no local run {name} in {directory}")
    spec = resolver.flow(snapshot.flow)
    if spec is None:
        _usage(f"run {name}: its snapshot has no Flow {snapshot.flow!r}")
    _draw(spec, flowrun_api.status_of(run).nodes, resolver.flows, output)


async def _read_run(
    api: Any, namespace: str, name: str
) -> tuple[dict[str, Any], snapshot_api.Snapshot]:
    """The FlowRun and its snapshot; without one (yet, or readable) the Flow as it is now."""
    from agentflows.cli import cluster
    from agentflows.kube import client as kube
    from agentflows.kube import snapshot

    run = await cluster.get_run(api, namespace, name)
    try:
        return run, await snapshot.read_snapshot(api, namespace, name)
    except snapshot.SnapshotError as exc:
        why = str(exc)
    except kube.ApiError as exc:
        if exc.status != 403:
            raise
        why = f"cannot read it: {exc}"
    flow_name = run["spec"]["flow"]
    try:
        flow = await api.get(kube.path_of("flows", namespace, flow_name))
    except kube.ApiError as missing:
        raise snapshot.SnapshotError(f"run {name}'s snapshot: {why}; its Flow: {missing}") from None
    click.echo(
        f"note: no snapshot of run {name} ({why}); drawing Flow {flow_name} as it is now",
        err=True,
    )
    return run, snapshot_api.Snapshot(flow_name, {flow_name: flow["spec"]}, {})


def _from_cluster(
    name: str,
    output: str,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
    looked_locally: str | None,
) -> None:
    import pydantic

    from agentflows.cli import cluster
    from agentflows.kube import client as kube
    from agentflows.kube import snapshot

    api = commands_cluster._client(kubeconfig, kube_context, looked_locally)
    ns = namespace or api.config.namespace

    async def go() -> tuple[dict[str, Any], snapshot_api.Snapshot]:
        async with api:
            return await _read_run(api, ns, name)

    try:
        run, snap = cluster.run_async(go())
        resolver = graph.StaticResolver.of_snapshot(snap)
    except (kube.ApiError, snapshot.SnapshotError) as exc:
        _usage(str(exc))
    except pydantic.ValidationError as exc:
        _usage(f"run {ns}/{name}: its snapshot does not hold valid specs: {exc}")
    spec = resolver.flow(snap.flow)
    if spec is None:
        _usage(f"run {ns}/{name}: its snapshot has no Flow {snap.flow!r}")
    _draw(spec, flowrun_api.status_of(run).nodes, resolver.flows, output)


def _looks_like_a_file(target: str) -> bool:
    """A path rather than a run name: it has a directory or a file suffix of Flow files."""
    return "/" in target or target.endswith((".yaml", ".yml", ".json"))


@click.command("graph")
@click.argument("targets", nargs=-1, required=True, metavar="FILE... | RUN")
@click.option("--flow", "flow_name", help="Flow to draw when the files hold several.")
@click.option(
    "-o",
    "--output",
    type=click.Choice(FORMATS),
    default="mermaid",
    show_default=True,
    help="mermaid (for Markdown), dot (Graphviz) or svg (needs Graphviz's dot).",
)
@commands_runs.local_option
@commands_runs.state_dir_option
@commands_cluster.namespace_option
@commands_cluster.kubeconfig_option
@commands_cluster.context_option
def graph_command(
    targets: tuple[str, ...],
    flow_name: str | None,
    output: str,
    local_only: bool,
    state_dir: str | None,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Draw a Flow of FILEs, or a run (phases and durations) as Mermaid, DOT or SVG.

    FILE... are Flow (and Agent) files or directories, as for run. RUN is a FlowRun of the
    cluster (-n, --kubeconfig, --context), drawn from its snapshot: the Flow as the run ran
    it; or a local run when the state directory holds it (--local, --state-dir insist).
    """
    params = click.get_current_context().params
    paths = [Path(t) for t in targets]
    run_options = local_only or state_dir or namespace or kubeconfig or kube_context
    if all(p.exists() for p in paths):
        if run_options:
            _usage(
                f"{targets[0]} is a file; -n, --kubeconfig, --context, --local and --state-dir "
                "choose where a RUN is read"
            )
        _from_files(paths, flow_name, output)
        return
    if len(targets) != 1 or (not run_options and _looks_like_a_file(targets[0])):
        missing = ", ".join(t for t, p in zip(targets, paths, strict=True) if not p.exists())
        _usage(f"no such file: {missing} (graph takes FILE... or one RUN)")
    if flow_name is not None:
        _usage("--flow chooses a Flow of FILEs; a run is drawn with its own Flow")
    name = targets[0]
    here, directory, missing_run = commands_runs.is_local(
        params, lambda d: local.is_run(d, name), f"no local run {name}"
    )
    if here:
        _from_local_run(directory, name, output)
        return
    _from_cluster(name, output, namespace, kubeconfig, kube_context, missing_run)


COMMANDS = [graph_command]
