"""Click commands that work on a cluster: start, watch, logs, and deciding human requests.

``approve``, ``reject`` and ``respond`` decide one request (``RUN [ID]``) or, for approve and
reject, every pending request of a Flow's runs (``--all --flow NAME``), as the caller
(:mod:`agentflows.cli.requests`); each shows only its own options. The cluster halves of
``get``, ``list`` and ``requests`` (:mod:`agentflows.cli.commands_runs`) are here too.

Registered on the ``agentflows`` group by :mod:`agentflows.cli.main`; the HTTP client and the
kube modules are imported when a command runs, not when the CLI starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click

from agentflows.api import flowrun as flowrun_api
from agentflows.api import schemas
from agentflows.cli import completion, group, live_text, local, views

T = TypeVar("T")

namespace_option = click.option(
    "-n", "--namespace", default=None, help="Namespace (default: the kubeconfig's)."
)
kubeconfig_option = click.option(
    "--kubeconfig", default=None, help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config)."
)
context_option = click.option(
    "--context",
    "kube_context",
    default=None,
    help="Kubeconfig context (default: its current-context).",
)


def _client(
    kubeconfig: str | None, kube_context: str | None, looked_locally: str | None = None
) -> Any:
    """The API client, or exit 2 saying why not (and ``looked_locally``: where else we looked)."""
    from agentflows.kube import client as kube
    from agentflows.kube import kubeconfig as kubeconfig_mod

    try:
        return kube.Client.from_env(kubeconfig, kube_context, retry_seconds=10)
    except (kubeconfig_mod.ConfigError, OSError) as exc:
        also = f"{looked_locally}, and " if looked_locally else ""
        click.echo(f"error: {also}{exc}", err=True)
        sys.exit(group.EXIT_INVALID)


def _fail(exc: Exception) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(group.EXIT_INVALID)


def _with_api(api: Any, use: Callable[[], Awaitable[T]]) -> T:
    """``use()`` with the client ``api`` open; an API error exits 2 naming it."""
    from agentflows.cli import cluster
    from agentflows.kube import client as kube

    async def go() -> T:
        async with api:
            try:
                return await use()
            except kube.ApiError as exc:
                _fail(exc)

    result: T = cluster.run_async(go())
    return result


@click.command()
@click.argument("flow")
@click.option("--input", "inputs", multiple=True, metavar="KEY=VALUE", help="Input field.")
@click.option("--input-json", help="The whole input as JSON.")
@click.option("--name", help="Run name (default: <flow>-<random>).")
@click.option("--wait", is_flag=True, help="Wait until the run ends or waits, and print it (-o).")
@click.option("--timeout", default=3600.0, help="Seconds to wait with --wait.")
@views.output_option(default="json")
@namespace_option
@kubeconfig_option
@context_option
def start(
    flow: str,
    inputs: tuple[str, ...],
    input_json: str | None,
    name: str | None,
    wait: bool,
    timeout: float,
    output: str,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Start a run of FLOW in the cluster (a FlowRun); print its name."""
    from agentflows.cli import cluster
    from agentflows.kube import actions
    from agentflows.kube import client as kube

    try:
        value = local.parse_inputs(inputs, input_json)
    except local.UsageError as exc:
        _fail(exc)
    too_large = flowrun_api.input_size_problem(value, "--input/--input-json")
    if too_large is not None:
        _fail(local.UsageError(too_large))
    api = _client(kubeconfig, kube_context)
    ns = namespace or api.config.namespace

    async def go() -> int:
        async with api:
            try:
                run = await actions.start(api, ns, flow, value, name=name)
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
            click.echo(views.render_run(last, output, status))
            _print_decisions(last, ns)
            return cluster.exit_code(status.phase)

    sys.exit(cluster.run_async(go()))


def _print_decisions(run: dict[str, Any], namespace: str) -> None:
    """On stderr, for each pending request of a waiting run: a command per choice."""
    from agentflows.cli import hints

    name = run["metadata"]["name"]
    for rid, request in views.pending_requests(run).items():
        commands = hints.cluster_commands(name, rid, request, namespace)
        click.echo(hints.describe(name, rid, request, commands), err=True)


def get_from_cluster(
    run_name: str,
    output: str,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
    looked_locally: str | None,
) -> None:
    """``agentflows get`` of a FlowRun: its summary with offloaded outputs read back."""
    from agentflows.cli import cluster

    api = _client(kubeconfig, kube_context, looked_locally)
    ns = namespace or api.config.namespace

    async def show() -> None:
        run = await cluster.get_run(api, ns, run_name)
        status = await cluster.resolve_outputs(api, ns, run)
        click.echo(views.render_run(run, output, status))

    _with_api(api, show)


def runs_from_cluster(
    flow: str | None,
    all_namespaces: bool,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
    looked_locally: str | None,
) -> tuple[list[dict[str, Any]], str]:
    """FlowRuns of a namespace (or all), optionally of one Flow, and where they were looked for."""
    from agentflows.cli import requests as requests_mod

    api = _client(kubeconfig, kube_context, looked_locally)
    ns = None if all_namespaces else (namespace or api.config.namespace)

    async def listed() -> list[dict[str, Any]]:
        return await requests_mod.list_runs(api, ns, flow)

    runs = _with_api(api, listed)
    return runs, ("in any namespace" if ns is None else f"in namespace {ns}")


@click.command()
@click.argument("run_name", shell_complete=completion.run_names)
@click.option("--timeout", default=3600.0, help="Give up after this many seconds.")
@live_text.stream_option
@namespace_option
@kubeconfig_option
@context_option
def watch(
    run_name: str,
    timeout: float,
    stream: bool | None,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Follow a run live: a line per node change, until it ends or waits.

    With --stream (the default on a terminal) agents' answers are printed on stderr as they
    are written, read from the runner pod's log as you (RBAC: pods/log get).
    """
    from agentflows.cli import cluster
    from agentflows.runner import stream_log

    api = _client(kubeconfig, kube_context)
    ns = namespace or api.config.namespace
    listener = live_text.TerminalListener() if live_text.wanted(stream) else None

    async def follow() -> int:
        text = None
        if listener is not None:
            text = asyncio.create_task(_show_text(api, ns, run_name, listener))
        before: dict[str, Any] = {"metadata": {"name": run_name}}
        phase = None
        try:
            async for run in cluster.follow(api, ns, run_name, give_up_after=timeout):
                for line in cluster.node_changes(before, run):
                    if listener is not None:
                        listener.break_line()
                    click.echo(line)
                before = run
                phase = flowrun_api.status_of(run).phase
            if text is not None and phase in stream_log.SETTLED:
                # the pod's last words may trail its result: read its log to its end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(text), TEXT_DRAIN_SECONDS)
        finally:
            if text is not None:
                text.cancel()
        _print_decisions(before, ns)
        return cluster.exit_code(phase)

    sys.exit(_with_api(api, follow))


#: How long ``watch --stream`` reads a finished run's pod log for text not shown yet.
TEXT_DRAIN_SECONDS = 15.0


async def _show_text(api: Any, namespace: str, name: str, listener: Any) -> None:
    """Print the run's streamed answers; a refusal is said once on stderr, the watch goes on."""
    from agentflows.kube import client as kube
    from agentflows.runner import stream_log

    try:
        async for event in stream_log.follow_run(api, namespace, name):
            stream_log.deliver(event, listener)
    except kube.ApiError as exc:
        listener.break_line()
        click.echo(f"live text not shown: {exc}", err=True)


@click.command()
@click.argument("run_name", shell_complete=completion.run_names)
@click.option("--attempt", type=int, default=None, help="Attempt (default: the current one).")
@namespace_option
@kubeconfig_option
@context_option
def logs(
    run_name: str,
    attempt: int | None,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Print the runner pod's log of a run."""
    from agentflows.cli import cluster

    api = _client(kubeconfig, kube_context)
    ns = namespace or api.config.namespace

    async def show() -> None:
        click.echo(await cluster.logs(api, ns, run_name, attempt), nl=False)

    _with_api(api, show)


COMMANDS = [start, watch, logs]


_DECIDE_HELP = {
    "approve": "Approve a run's pending request (RUN [ID]), or all of a Flow's (--all --flow).",
    "reject": "Reject a run's pending request (RUN [ID]), or all of a Flow's (--all --flow).",
    "respond": "Answer a run's input request with --data JSON (checked against its schema).",
}


def _json_options(edits: str | None, data: str | None) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for option, text in (("edits", edits), ("data", data)):
        if text is not None:
            try:
                parsed[option] = json.loads(text)
            except ValueError as exc:
                _fail(local.UsageError(f"--{option} is not JSON: {exc}"))
    return parsed


def _pick_request(run: dict[str, Any], request_id: str | None, parsed: dict[str, Any]) -> str:
    pending = views.pending_requests(run)
    names = ", ".join(pending) or "none"
    if request_id is None and len(pending) != 1:
        _fail(local.UsageError(f"{len(pending)} requests pending ({names}); name one"))
    chosen = request_id or next(iter(pending))
    if chosen not in pending:
        _fail(local.UsageError(f"no pending request {chosen!r} (pending: {names})"))
    schema = pending[chosen].schema_
    if "data" in parsed and schema is not None:
        found = schemas.mismatch(schema, parsed["data"])
        if found is not None:
            _fail(
                local.UsageError(
                    f"--data does not match the schema at {found.where}: {found.message}"
                )
            )
    return chosen


async def _decide(
    api: Any,
    ns: str,
    target: str | None,
    request_id: str | None,
    flow: str | None,
    decision: str,
    comment: str | None,
    parsed: dict[str, Any],
) -> int:
    from agentflows.cli import cluster
    from agentflows.cli import requests as requests_mod
    from agentflows.kube import actions

    who = await actions.whoami(api)
    if target is None:
        runs = await requests_mod.list_runs(api, ns, flow)
        rows = await requests_mod.decide_all(
            api, runs, decision=decision, decided_by=who, comment=comment
        )
        for name, rid, error in rows:
            click.echo(f"{name} {rid}: " + (f"denied: {error}" if error else decision))
        failed = sum(1 for row in rows if row[2])
        click.echo(f"{len(rows) - failed} request(s) decided {decision} by {who}", err=True)
        return group.EXIT_INVALID if failed else 0
    run = await cluster.get_run(api, ns, target)
    rid = _pick_request(run, request_id, parsed)
    await actions.decide(
        api,
        ns,
        target,
        rid,
        decision=decision,
        decided_by=who,
        comment=comment,
        edits=parsed.get("edits"),
        data=parsed.get("data"),
    )
    click.echo(f"{target} {rid}: {decision} by {who}")
    return 0


#: The options of each deciding command beyond RUN [ID], --comment and the cluster's.
_DECIDE_OPTIONS: dict[str, tuple[Any, ...]] = {
    "approve": (
        click.option("--edits", help="Replacement arguments as JSON (approve with edits)."),
        click.option("--all", "all_runs", is_flag=True, help="Every pending request of --flow."),
        click.option("--flow", help="With --all: the Flow whose runs to decide."),
    ),
    "reject": (
        click.option("--all", "all_runs", is_flag=True, help="Every pending request of --flow."),
        click.option("--flow", help="With --all: the Flow whose runs to decide."),
    ),
    "respond": (
        click.option("--data", required=True, help="The answer as JSON (checked by the schema)."),
    ),
}


def _decide_command(decision: str) -> click.Command:
    def command(
        run_name: str | None,
        request_id: str | None,
        comment: str | None,
        namespace: str | None,
        kubeconfig: str | None,
        kube_context: str | None,
        edits: str | None = None,
        data: str | None = None,
        all_runs: bool = False,
        flow: str | None = None,
    ) -> None:
        from agentflows.cli import cluster
        from agentflows.kube import client as kube

        if all_runs == (run_name is not None) or (all_runs and not flow):
            usage = "give RUN [ID], or --all --flow NAME" if decision != "respond" else "give RUN"
            _fail(local.UsageError(usage))
        parsed = _json_options(edits, data)
        chosen = "edit" if decision == "approve" and "edits" in parsed else decision
        api = _client(kubeconfig, kube_context)

        async def go() -> int:
            async with api:
                try:
                    ns = namespace or api.config.namespace
                    return await _decide(
                        api, ns, run_name, request_id, flow, chosen, comment, parsed
                    )
                except kube.ApiError as exc:
                    click.echo(f"error: {exc.message or exc}", err=True)
                    return group.EXIT_INVALID

        sys.exit(cluster.run_async(go()))

    for option in reversed(
        (
            click.argument(
                "run_name", required=decision == "respond", shell_complete=completion.run_names
            ),
            click.argument("request_id", required=False),
            click.option("--comment", help="A comment kept with the decision."),
            *_DECIDE_OPTIONS[decision],
            namespace_option,
            kubeconfig_option,
            context_option,
        )
    ):
        command = option(command)
    return click.command(decision, help=_DECIDE_HELP[decision])(command)


COMMANDS += [
    _decide_command("approve"),
    _decide_command("reject"),
    _decide_command("respond"),
]
