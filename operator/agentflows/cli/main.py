"""Entry point of the ``agentflows`` command (click).

Local commands: ``run``, ``resume``, ``validate``, ``crds``. Heavy libraries (litellm, kopf,
kubernetes) are imported inside the commands that need them, so ``agentflows run`` on a flow
without model nodes starts its first node quickly.

Exit codes: 0 success, 1 the run failed, 2 bad input or usage (nothing was run), 3 the run is
waiting for a human (``agentflows resume`` continues it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from agentflows.cli import commands_cluster, local

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_WAITING = 3


def _err(message: str) -> None:
    click.echo(message, err=True)


class _Progress:
    """Prints one line per node event on stderr."""

    SYMBOLS = {"started": "…", "succeeded": "✓", "failed": "✗", "waiting": "⏸", "skipped": "↷"}

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started: dict[str, float] = {}

    def __call__(self, event: Any) -> None:
        if self.quiet:
            return
        if event.kind == "started":
            self.started[event.key] = time.monotonic()
            _err(f"  {self.SYMBOLS['started']} {event.key} ({event.node_kind})")
            return
        took = time.monotonic() - self.started.get(event.key, time.monotonic())
        line = f"  {self.SYMBOLS.get(event.kind, '?')} {event.key} ({event.node_kind}) {event.kind}"
        if event.kind in ("succeeded", "failed"):
            line += f" in {took:.2f}s"
        status = event.status
        if event.kind == "failed" and status is not None and status.error:
            line += f": {status.error}"
        _err(line)


@click.group()
@click.version_option(package_name="agentflows")
def main() -> None:
    """Run LLM-agent workflows: locally from files, or on Kubernetes as custom resources."""


for _command in commands_cluster.COMMANDS:
    main.add_command(_command)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def validate(files: tuple[Path, ...]) -> None:
    """Check Agent, Flow and FlowRun files and explain every problem (exit 2 if any)."""
    from agentflows.api import documents

    loaded = documents.load_paths(files)
    for note in loaded.skipped:
        _err(f"skipped {note}")
    problems = local.validate_loaded(loaded)
    if not problems and not loaded.resources:
        where = ", ".join(loaded.sources) or ", ".join(str(f) for f in files)
        problems = [documents.Problem("", f"no Agent, Flow or FlowRun in {where}")]
    for problem in problems:
        click.echo(str(problem))
    if problems:
        _err(f"{len(problems)} problem(s) found")
        sys.exit(EXIT_INVALID)
    click.echo(f"{len(loaded.resources)} resource(s) valid")


@main.command()
def crds() -> None:
    """Print the CustomResourceDefinitions as YAML (pipe to kubectl apply -f -)."""
    from agentflows.api import crd

    click.echo(crd.render_yaml(crd.build_crds()), nl=False)


def _capabilities(mock: bool, resolver: Any) -> Any:
    if mock:
        from agentflows.agents import mock as mock_mod

        return mock_mod.MockCapabilities(resolver)
    from agentflows.agents import host

    return host.LiveCapabilities(resolver)


def _state_json(name: str, outcome: Any, checkpoint: Any) -> dict[str, Any]:
    return {
        "name": name,
        "phase": outcome.phase.value,
        "reason": outcome.reason,
        "message": outcome.message,
        "output": outcome.output,
        "usage": outcome.usage.to_wire(),
        "nodes": {k: v.to_wire() for k, v in checkpoint.nodes.items()},
        "requests": {k: v.to_wire() for k, v in checkpoint.requests.items()},
    }


def _execute(
    name: str,
    snapshot: local.Snapshot,
    input_value: Any,
    directory: Path,
    quiet: bool,
    trigger: Any = None,
) -> None:
    from agentflows.engine import graph, run, store

    resolver = snapshot.resolver()
    spec = resolver.flow(snapshot.flow)
    assert spec is not None
    compiled = graph.compile_flow(spec, resolver)
    file_store = store.FileStore(directory / f"{name}.json")
    outcome = asyncio.run(
        run.run_flow(
            compiled,
            run_name=name,
            input_value=input_value,
            store_=file_store,
            caps=_capabilities(snapshot.mock, resolver),
            resolver=resolver,
            trigger=trigger,
            observer=_Progress(quiet),
        )
    )
    click.echo(
        json.dumps(_state_json(name, outcome, file_store.read()), indent=2, ensure_ascii=False)
    )
    phase = outcome.phase.value
    if phase == "Waiting":
        pending = [rid for rid, r in file_store.read().requests.items() if r.decision is None]
        for rid in pending:
            _err(
                f"run {name} waits for request {rid!r}: "
                f"agentflows resume {name} --request {rid} --decision approve|reject"
            )
        sys.exit(EXIT_WAITING)
    _err(
        f"run {name} {phase}"
        + (f": {outcome.message}" if outcome.message and phase != "Succeeded" else "")
    )
    if phase != "Succeeded":
        sys.exit(EXIT_FAILED)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--flow", "flow_name", help="Flow to run when the files hold several.")
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Input field (VALUE parsed as JSON when it is).",
)
@click.option("--input-json", help="The whole input as JSON.")
@click.option(
    "--dry-run", is_flag=True, help="Use the deterministic mock model and tools; call nothing."
)
@click.option("--name", "run_name", help="Run name (default: <flow>-<random>).")
@click.option(
    "--state-dir",
    help="Where run state is kept (default: $AGENTFLOWS_STATE_DIR or .agentflows/runs).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def run(
    files: tuple[Path, ...],
    flow_name: str | None,
    inputs: tuple[str, ...],
    input_json: str | None,
    dry_run: bool,
    run_name: str | None,
    state_dir: str | None,
    quiet: bool,
) -> None:
    """Run a flow from FILES on this machine and print the final run state as JSON.

    Without --dry-run, models with a key (OPENAI_API_KEY, ... or an Agent's apiKey secret
    exported as AGENTFLOWS_SECRET_<NAME>_<KEY>) or an apiBase are called for real; when a
    model has neither, the whole run uses the embedded mock model and says so.
    """
    from agentflows.api import documents

    loaded = documents.load_paths(files)
    problems = local.validate_loaded(loaded)
    if problems:
        for problem in problems:
            click.echo(str(problem), err=True)
        sys.exit(EXIT_INVALID)
    try:
        chosen = local.pick_flow(loaded, flow_name)
        value = local.parse_inputs(inputs, input_json)
    except local.UsageError as exc:
        _err(f"error: {exc}")
        sys.exit(EXIT_INVALID)
    resolver = local.resolver_of(loaded)
    mock = dry_run
    if not dry_run:
        missing = local.missing_credentials(local.models_used(chosen.spec, resolver), os.environ)
        if missing:
            _err(
                f"note: no key or apiBase for {', '.join(missing)}; using the embedded mock model "
                "(export the provider's key, e.g. OPENAI_API_KEY, or set model.apiBase to call it)"
            )
            mock = True
    name = run_name or local.new_run_name(chosen.metadata.name or "flow")
    directory = local.state_dir(state_dir)
    if (directory / f"{name}.json").exists():
        _err(f"error: run {name} already exists in {directory}; use agentflows resume {name}")
        sys.exit(EXIT_INVALID)
    snapshot = local.Snapshot(
        flow=chosen.metadata.name or "",
        flows={n: s.to_wire() for n, s in resolver.flows.items()},
        agents={n: s.to_wire() for n, s in resolver.agents.items()},
        mock=mock,
    )
    snapshot.save(directory / f"{name}.snapshot.json")
    _err(f"run {name}: flow {chosen.metadata.name}" + (" (mock model)" if mock else ""))
    _execute(name, snapshot, value, directory, quiet)


@main.command()
@click.argument("run_name")
@click.option(
    "--decision",
    type=click.Choice(["approve", "reject", "edit", "respond"]),
    help="The decision (default: respond with --data, edit with --edits).",
)
@click.option("--request", "request_id", help="Request to decide when several are pending.")
@click.option("--edits", help="Replacement arguments as JSON (decision edit).")
@click.option("--data", help="Answer as JSON (input requests).")
@click.option("--comment", help="A comment kept with the decision.")
@click.option(
    "--by", "decided_by", default=lambda: os.environ.get("USER", "local"), help="Who decides."
)
@click.option("--state-dir", help="Where run state is kept.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def resume(
    run_name: str,
    decision: str | None,
    request_id: str | None,
    edits: str | None,
    data: str | None,
    comment: str | None,
    decided_by: str,
    state_dir: str | None,
    quiet: bool,
) -> None:
    """Decide a pending request of a local run and continue it from its saved state."""
    from agentflows.engine import run as run_mod
    from agentflows.engine import store

    directory = local.state_dir(state_dir)
    snapshot_path = directory / f"{run_name}.snapshot.json"
    if not snapshot_path.exists():
        _err(f"error: no local run {run_name} in {directory}")
        sys.exit(EXIT_INVALID)
    snapshot = local.Snapshot.load(snapshot_path)
    file_store = store.FileStore(directory / f"{run_name}.json")
    checkpoint = file_store.read()
    pending = {rid: r for rid, r in checkpoint.requests.items() if r.decision is None}
    try:
        fields = _decision_fields(pending, request_id, decision, edits, data, comment, decided_by)
    except local.UsageError as exc:
        _err(f"error: {exc}")
        sys.exit(EXIT_INVALID)
    if fields is not None:
        rid, values = fields
        values["decided_at"] = run_mod.timestamp()
        asyncio.run(file_store.decide(rid, **values))
        _err(f"request {rid}: {values['decision']} by {decided_by}")
    run_record = checkpoint.run
    _execute(run_name, snapshot, run_record.input if run_record else None, directory, quiet)


def _decision_fields(
    pending: dict[str, Any],
    request_id: str | None,
    decision: str | None,
    edits: str | None,
    data: str | None,
    comment: str | None,
    decided_by: str,
) -> tuple[str, dict[str, Any]] | None:
    import jsonschema

    if decision is None and edits is None and data is None:
        return None
    if not pending:
        raise local.UsageError("the run has no pending request")
    if request_id is None:
        if len(pending) != 1:
            raise local.UsageError(
                f"several requests pending ({', '.join(pending)}); choose one with --request"
            )
        request_id = next(iter(pending))
    if request_id not in pending:
        raise local.UsageError(
            f"no pending request {request_id!r} (pending: {', '.join(pending) or 'none'})"
        )
    values: dict[str, Any] = {"decided_by": decided_by, "comment": comment}
    for option, text in (("edits", edits), ("data", data)):
        if text is not None:
            try:
                values[option] = json.loads(text)
            except ValueError as exc:
                raise local.UsageError(f"--{option} is not JSON: {exc}") from exc
    request = pending[request_id]
    if decision is None:
        decision = "respond" if data is not None else "edit"
    if data is not None and request.schema_ is not None:
        errors = list(jsonschema.Draft202012Validator(request.schema_).iter_errors(values["data"]))
        if errors:
            raise local.UsageError(
                f"--data does not match the request's schema: {errors[0].message}"
            )
    if request.kind.value == "input" and decision == "approve":
        raise local.UsageError("an input request needs --data (or --decision reject)")
    values["decision"] = decision
    return request_id, values


@main.command()
@click.option("--namespace", required=True, help="Namespace of the FlowRun.")
@click.option("--flowrun", required=True, help="Name of the FlowRun to run.")
def runner(namespace: str, flowrun: str) -> None:
    """Run one attempt of a FlowRun in its pod (exit 0 Succeeded, 1 Failed, 3 Waiting)."""
    from agentflows.runner import main as runner_main

    sys.exit(runner_main.main(namespace, flowrun))


@main.command("operator")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to watch (repeatable; default: $AGENTFLOWS_NAMESPACES, else all).",
)
@click.option("--metrics-port", default=8080, show_default=True, help="Port of /metrics (0: off).")
@click.option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option("--workers", default=8, show_default=True, help="Concurrent reconciles.")
def operator_command(
    namespaces: tuple[str, ...], metrics_port: int, kubeconfig: str | None, workers: int
) -> None:
    """Run the Kubernetes operator (reconciles Agents, Flows and FlowRuns)."""
    import logging

    from agentflows.controller import main as operator_main
    from agentflows.controller import settings as operator_settings

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = operator_settings.OperatorConfig(
        namespaces=namespaces or operator_settings.namespaces_from_env(),
        runner_image=operator_settings.runner_image_from_env(),
        metrics_port=metrics_port or None,
        workers=workers,
    )
    asyncio.run(operator_main.run(config, kubeconfig))


@main.command("trigger")
@click.option("--flow", "flow_ref", required=True, help="The Flow, as NAMESPACE/NAME.")
@click.option("--trigger", "trigger_name", required=True, help="Name of its schedule trigger.")
@click.option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
def trigger_command(flow_ref: str, trigger_name: str, kubeconfig: str | None) -> None:
    """Create the FlowRun of a schedule trigger (the command of the trigger's CronJob pod)."""
    from agentflows.triggers import common as trigger_common
    from agentflows.triggers import schedule

    try:
        name = asyncio.run(schedule.run_trigger_command(flow_ref, trigger_name, kubeconfig))
    except trigger_common.TriggerError as exc:
        _err(f"error: {exc}")
        sys.exit(EXIT_FAILED)
    click.echo(name)


@main.command("webhook")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port to listen on.")
@click.option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Serve only Flows of this namespace (repeatable; default: all namespaces).",
)
def webhook_command(
    host: str, port: int, kubeconfig: str | None, namespaces: tuple[str, ...]
) -> None:
    """Serve the webhook receiver: signed POST /hooks/NS/FLOW/TRIGGER start FlowRuns."""
    import logging

    from agentflows.triggers import webhook

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    webhook.serve(host, port, kubeconfig, webhook.Settings(namespaces=namespaces))


if __name__ == "__main__":
    main()
