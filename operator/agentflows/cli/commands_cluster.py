"""Click commands that work on a cluster: start, get, watch, logs, and the human requests.

``requests`` lists pending requests; ``approve``, ``reject`` and ``respond`` decide one
(``RUN [ID]``) or, for approve and reject, every pending request of a Flow's runs
(``--all --flow NAME``), as the caller (:mod:`agentflows.cli.requests`).

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


#: Longest message or summary shown in a cell of the ``requests`` table.
_CELL_CHARS = 60


def _cell(text: Any) -> str:
    """One line of at most ``_CELL_CHARS`` characters."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= _CELL_CHARS else line[: _CELL_CHARS - 3] + "..."


def _request_rows(runs: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    from agentflows.cli import requests as requests_mod

    rows = []
    for run in runs:
        for rid, request in requests_mod.pending_requests(run).items():
            rows.append(
                (
                    run["metadata"]["namespace"],
                    run["spec"]["flow"],
                    run["metadata"]["name"],
                    rid,
                    str(request.get("kind", "")),
                    _cell(request.get("message")),
                    _cell(request.get("summary")),
                    requests_mod.age(request.get("requestedAt")),
                )
            )
    return sorted(rows)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


@click.command()
@click.option("-A", "--all-namespaces", is_flag=True, help="Requests in every namespace.")
@click.option("--flow", help="Only runs of this Flow.")
@namespace_option
@kubeconfig_option
def requests(
    all_namespaces: bool, flow: str | None, namespace: str | None, kubeconfig: str | None
) -> None:
    """List pending human requests: flow, run, request, kind, message, summary and age."""
    from agentflows.cli import cluster
    from agentflows.cli import requests as requests_mod
    from agentflows.kube import client as kube

    api = _client(kubeconfig)
    ns = None if all_namespaces else (namespace or api.config.namespace)

    async def go() -> None:
        async with api:
            try:
                runs = await requests_mod.list_runs(api, ns, flow)
            except kube.ApiError as exc:
                _fail(exc)
            rows = _request_rows(runs)
            if not rows:
                where = "any namespace" if ns is None else f"namespace {ns}"
                click.echo(f"No pending requests in {where}.", err=True)
                return
            header = ("FLOW", "RUN", "REQUEST", "KIND", "MESSAGE", "SUMMARY", "AGE")
            if ns is None:
                click.echo(_table(("NAMESPACE", *header), rows))
            else:
                click.echo(_table(header, [row[1:] for row in rows]))

    cluster.run_async(go())


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
    from agentflows.cli import requests as requests_mod

    pending = requests_mod.pending_requests(run)
    names = ", ".join(pending) or "none"
    if request_id is None and len(pending) != 1:
        _fail(local.UsageError(f"{len(pending)} requests pending ({names}); name one"))
    chosen = request_id or next(iter(pending))
    if chosen not in pending:
        _fail(local.UsageError(f"no pending request {chosen!r} (pending: {names})"))
    schema = pending[chosen].get("schema")
    if "data" in parsed and schema is not None:
        import jsonschema

        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(parsed["data"]))
        if errors:
            _fail(local.UsageError(f"--data does not match the schema: {errors[0].message}"))
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

    who = await requests_mod.whoami(api)
    if target is None:
        runs = await requests_mod.list_runs(api, ns, flow)
        rows = await requests_mod.decide_all(
            api, runs, decision=decision, decided_by=who, comment=comment
        )
        for name, rid, error in rows:
            click.echo(f"{name} {rid}: " + (f"denied: {error}" if error else decision))
        failed = sum(1 for row in rows if row[2])
        click.echo(f"{len(rows) - failed} request(s) decided {decision} by {who}", err=True)
        return 1 if failed else 0
    run = await cluster.get_run(api, ns, target)
    rid = _pick_request(run, request_id, parsed)
    await requests_mod.decide(
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


def _decide_command(decision: str) -> click.Command:
    @click.command(decision, help=_DECIDE_HELP[decision])
    @click.argument("run_name", required=False)
    @click.argument("request_id", required=False)
    @click.option("--comment", help="A comment kept with the decision.")
    @click.option("--edits", help="Replacement arguments as JSON (edit a proposed action).")
    @click.option("--data", help="The answer as JSON (input requests).")
    @click.option("--all", "all_runs", is_flag=True, help="Every pending request of --flow.")
    @click.option("--flow", help="With --all: the Flow whose runs to decide.")
    @namespace_option
    @kubeconfig_option
    def command(
        run_name: str | None,
        request_id: str | None,
        comment: str | None,
        edits: str | None,
        data: str | None,
        all_runs: bool,
        flow: str | None,
        namespace: str | None,
        kubeconfig: str | None,
    ) -> None:
        from agentflows.cli import cluster
        from agentflows.kube import client as kube

        if all_runs == (run_name is not None) or (all_runs and not flow):
            _fail(local.UsageError("give RUN [ID], or --all --flow NAME"))
        parsed = _json_options(edits, data)
        if decision == "respond" and ("data" not in parsed or all_runs):
            _fail(local.UsageError("respond needs RUN ID and --data JSON (no --all)"))
        chosen = "edit" if decision == "approve" and "edits" in parsed else decision
        api = _client(kubeconfig)

        async def go() -> int:
            async with api:
                try:
                    ns = namespace or api.config.namespace
                    return await _decide(
                        api, ns, run_name, request_id, flow, chosen, comment, parsed
                    )
                except kube.ApiError as exc:
                    click.echo(f"error: {exc.message or exc}", err=True)
                    return 1

        sys.exit(cluster.run_async(go()))

    return command


COMMANDS += [
    requests,
    _decide_command("approve"),
    _decide_command("reject"),
    _decide_command("respond"),
]
