"""Entry point of the ``agentflows`` command (click).

Local commands: ``validate``, ``run``, ``resume`` (and ``list``/``get``/``requests``, which show
local runs or a cluster's, :mod:`agentflows.cli.commands_runs`). Heavy libraries (litellm,
kubernetes) are imported inside the commands that need them, the commands of other modules
when they run (:data:`_ELSEWHERE`), so ``agentflows run`` on a
flow without model nodes starts its first node quickly. Exit codes: :mod:`agentflows.cli.group`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from agentflows import tracing
from agentflows.api import flowrun as flowrun_api
from agentflows.api import snapshot as snapshot_api
from agentflows.api import times
from agentflows.cli import (
    commands_agentspec,
    completion,
    group,
    live_text,
    local,
    local_runs,
    run_lock,
    views,
)

if TYPE_CHECKING:  # imported by the commands that use them, to start quickly
    from agentflows.api import flow as flow_api
    from agentflows.engine import graph


def _err(message: str) -> None:
    click.echo(message, err=True)


def _usage(message: str) -> NoReturn:
    _err(f"error: {message}")
    sys.exit(group.EXIT_INVALID)


@contextlib.contextmanager
def _cluster_errors() -> Iterator[None]:
    """No credentials or no API server: ``error: ...`` in words and exit 2, not a traceback."""
    from agentflows.kube import client as kube
    from agentflows.kube import kubeconfig

    try:
        yield
    except (kubeconfig.ConfigError, kube.ApiError) as exc:
        _usage(str(exc))


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


#: The commands defined in other modules, imported only when they run (:class:`group.Group`).
_ELSEWHERE = {
    **dict.fromkeys(("start", "watch", "logs", "approve", "reject", "respond"), "commands_cluster"),
    **dict.fromkeys(("get", "list", "requests"), "commands_runs"),
    **dict.fromkeys(("import", "export"), "commands_agentspec"),
    "graph": "commands_graph",
    "draft": "commands_draft",
    "runner": "runner_command",
    "console": "console_command",
    "sessions": "commands_sessions",
}


@click.group(
    cls=group.Group,
    context_settings=group.CONTEXT_SETTINGS,
    lazy={name: f"agentflows.cli.{module}" for name, module in _ELSEWHERE.items()},
)
@click.version_option(package_name="agentflows")
def main() -> None:
    """Run LLM-agent workflows: locally from files, or on Kubernetes as custom resources.

    Exit codes: 0 done, 1 the run failed, 2 bad input (nothing ran), 3 waiting for a human,
    130 interrupted (Ctrl-C), 70 an internal error.
    """


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@commands_agentspec.tools_option
def validate(files: tuple[Path, ...], tools_module: Path | None) -> None:
    """Check Agent, Flow and FlowRun files and explain every problem (exit 2 if any)."""
    from agentflows.api import documents

    impl = commands_agentspec.implementations(tools_module)
    loaded = commands_agentspec.load_paths(files, impl)
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
        sys.exit(group.EXIT_INVALID)
    click.echo(f"{len(loaded.resources)} resource(s) valid")


@main.command()
def crds() -> None:
    """Print the CustomResourceDefinitions as YAML (pipe to kubectl apply -f -)."""
    from agentflows.api import crd

    click.echo(crd.render_yaml(crd.build_crds()), nl=False)


def _capabilities(
    mock: bool, resolver: Any, directory: Path, files_root: str = "", stream: bool = False
) -> Any:
    if mock:
        from agentflows.agents import mock as mock_mod

        return mock_mod.MockCapabilities(resolver)
    from agentflows.agents import files, host

    access = files.FileAccess(root=Path(files_root)) if files_root else files.NO_FILE_ACCESS
    return host.LiveCapabilities(
        resolver,
        session_store=local.session_store(directory),
        file_access=access,
        listener=live_text.TerminalListener() if stream else None,
    )


def _resume_command(name: str, state_dir: str | None) -> str:
    import shlex

    words = ["agentflows", "resume", name]
    return shlex.join([*words, "--state-dir", state_dir] if state_dir is not None else words)


def _execute(
    name: str,
    started: local.SnapshotFile,
    input_value: Any,
    state_dir: str | None,
    quiet: bool,
    output: str,
    stream: bool = False,
) -> NoReturn:
    """Run (or resume) a local run to its end or next pause, print it, exit with its code.

    With ``stream``, agents' answers are printed on stderr as they are written
    (:mod:`.live_text`); what is recorded and printed on stdout is the same.
    """
    from agentflows.engine import graph, run, store

    directory = local.state_dir(state_dir)
    resolver = graph.StaticResolver.of_snapshot(started.snapshot)
    spec = resolver.flow(started.snapshot.flow)
    assert spec is not None
    compiled = graph.compile_flow(spec, resolver)
    path = local.state_path(directory, name)
    uid = tracing.local_run_uid(path)
    tracing.configure("agentflows-cli")
    try:
        with tracing.run_context(uid, None):
            outcome = asyncio.run(
                run.run_flow(
                    compiled,
                    run_name=name,
                    input_value=input_value,
                    store_=store.FileStore(path),
                    caps=_capabilities(
                        started.mock, resolver, directory, started.files_root, stream
                    ),
                    resolver=resolver,
                    observer=_Progress(quiet),
                )
            )
        shown = _show(directory, name, output)
        if outcome.phase.terminal:
            _trace_run(uid, shown)
    except KeyboardInterrupt:
        local_runs.save_interrupted(directory, name)
        _show(directory, name, output)
        _err(f"run {name} interrupted; continue it with: {_resume_command(name, state_dir)}")
        sys.exit(group.EXIT_INTERRUPTED)
    finally:
        tracing.shutdown()
    phase = outcome.phase
    if phase is flowrun_api.RunPhase.WAITING:
        from agentflows.cli import hints

        for rid, request in views.pending_requests(shown).items():
            commands = hints.commands(name, rid, request, state_dir)
            _err(hints.describe(name, rid, request, commands))
        sys.exit(group.EXIT_WAITING)
    succeeded = phase is flowrun_api.RunPhase.SUCCEEDED
    _err(
        f"run {name} {phase}"
        + (f": {outcome.message}" if outcome.message and not succeeded else "")
    )
    sys.exit(0 if succeeded else group.EXIT_FAILED)


def _trace_run(uid: str, shown: dict[str, Any]) -> None:
    """Export a finished local run's own span, the parent of its executions' (as the operator)."""
    status, name = flowrun_api.status_of(shown), shown["metadata"]["name"]
    started = times.parse_time(status.start_time)
    completed = times.parse_time(status.completion_time)
    if started is None or completed is None or status.phase is None:
        return
    start_ns = int(started.timestamp() * 1e9)
    end_ns = int(completed.timestamp() * 1e9)
    attributes = {"agentflows.run.name": name, "agentflows.run.phase": status.phase.value}
    tracing.record_run(uid, None, f"flowrun {name}", attributes, start_ns, max(end_ns, start_ns))


def _show(directory: Path, name: str, output: str) -> dict[str, Any]:
    """Print the run as ``get`` would; return its FlowRun object."""
    shown = local_runs.read(directory, name)
    assert shown is not None, "the run's snapshot was written before it started"
    click.echo(views.render_run(shown, output))
    return shown


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
@click.option(
    "--name", "run_name", help="Run name: a DNS-1123 label (default: <flow>-<6 hex digits>)."
)
@click.option(
    "--state-dir",
    help="Where run state is kept (default: $AGENTFLOWS_STATE_DIR or .agentflows/runs).",
)
@commands_agentspec.tools_option
@views.output_option(default="json")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@live_text.stream_option
def run(
    files: tuple[Path, ...],
    flow_name: str | None,
    inputs: tuple[str, ...],
    input_json: str | None,
    dry_run: bool,
    run_name: str | None,
    state_dir: str | None,
    tools_module: Path | None,
    output: str,
    quiet: bool,
    stream: bool | None,
) -> None:
    """Run a flow from FILES on this machine and print the final run state (JSON by default).

    Without --dry-run, models with a key (OPENAI_API_KEY, ... or an Agent's apiKey secret
    exported as AGENTFLOWS_SECRET_<NAME>_<KEY>) or an apiBase are called for real; when a
    model has neither, the whole run uses the embedded mock model and says so. Ctrl-C saves
    the run; agentflows resume RUN continues it. Agents' answers are printed on stderr as
    they are written on a terminal or with --stream; stdout keeps the final run state.
    """
    from agentflows.engine import run as run_mod

    impl = commands_agentspec.implementations(tools_module, dry_run=dry_run)
    loaded = commands_agentspec.load_paths(files, impl)
    problems = local.validate_loaded(loaded)
    if problems:
        for problem in problems:
            click.echo(str(problem), err=True)
        sys.exit(group.EXIT_INVALID)
    try:
        chosen = local.pick_flow(loaded, flow_name or commands_agentspec.flow_to_run(loaded))
        value = local.parse_inputs(inputs, input_json)
        name = local.check_run_name(run_name or local.new_run_name(chosen.metadata.name or ""))
    except local.UsageError as exc:
        _usage(str(exc))
    bad_input = run_mod.input_problems(chosen.spec.input, value)
    if bad_input:
        for line in bad_input:
            _err(f"error: {line}")
        _usage(
            f"the input does not match Flow {chosen.metadata.name}'s spec.input "
            "(give fields with --input KEY=VALUE, or all of it with --input-json JSON)"
        )
    resolver = local.resolver_of(loaded)
    mock = dry_run
    if not dry_run:
        missing = local.missing_credentials(
            local.models_used(chosen.metadata.name or "", resolver), os.environ
        )
        if missing:
            _err(
                f"note: no key or apiBase for {', '.join(missing)}; using the embedded mock model "
                "(export the provider's key, e.g. OPENAI_API_KEY, or set model.apiBase to call it)"
            )
            mock = True
    root = local.files_root(loaded, chosen)
    with _owned(local.state_dir(state_dir), name):
        started = _snapshot(local.state_dir(state_dir), name, chosen, resolver, mock, root)
        _err(f"run {name}: flow {chosen.metadata.name}" + (" (mock model)" if mock else ""))
        _execute(name, started, value, state_dir, quiet, output, live_text.wanted(stream))


@contextlib.contextmanager
def _owned(directory: Path, name: str) -> Iterator[None]:
    """Own run ``name`` for the block (:mod:`.run_lock`); exit 2 when another process does."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(run_lock.hold(directory, name))
    except run_lock.RunBusy as busy:
        _usage(str(busy))
    except OSError as exc:
        _usage(
            f"cannot keep run state in {directory}: {exc.strerror or exc} "
            "(--state-dir or $AGENTFLOWS_STATE_DIR names a writable directory)"
        )
    with held:
        yield


def _snapshot(
    directory: Path,
    name: str,
    chosen: flow_api.Flow,
    resolver: graph.StaticResolver,
    mock: bool,
    files_root: str,
) -> local.SnapshotFile:
    """Write a new run's snapshot, the first file of a run (exit 2 when it cannot be)."""
    if local.snapshot_path(directory, name).exists():
        _usage(f"run {name} already exists in {directory}; use agentflows resume {name}")
    snapshot = snapshot_api.Snapshot(
        chosen.metadata.name or "",
        {n: s.to_wire() for n, s in resolver.flows.items()},
        {n: s.to_wire() for n, s in resolver.agents.items()},
    )
    started = local.SnapshotFile(snapshot, mock=mock, files_root=files_root)
    try:
        started.save(local.snapshot_path(directory, name))
    except OSError as exc:
        _usage(
            f"cannot keep run state in {directory}: {exc.strerror or exc} "
            "(--state-dir or $AGENTFLOWS_STATE_DIR names a writable directory)"
        )
    return started


@main.command()
@click.argument("run_name", shell_complete=completion.run_names)
@click.option(
    "--decision",
    type=click.Choice([d.value for d in flowrun_api.Decision]),
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
@views.output_option(default="json")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@live_text.stream_option
def resume(
    run_name: str,
    decision: str | None,
    request_id: str | None,
    edits: str | None,
    data: str | None,
    comment: str | None,
    decided_by: str,
    state_dir: str | None,
    output: str,
    quiet: bool,
    stream: bool | None,
) -> None:
    """Continue a local run from its saved state, deciding a pending request if one is given.

    A run that waits needs a decision; a run stopped by Ctrl-C (or a killed process) goes on
    from where it stopped, without running its finished nodes again.
    """
    directory = local.state_dir(state_dir)
    snapshot_file = local.snapshot_path(directory, run_name)
    if not snapshot_file.is_file():
        _usage(f"no local run {run_name} in {directory}")
    with _owned(directory, run_name):
        _resume_owned(run_name, directory, (request_id, decision, edits, data, comment, decided_by),
                      state_dir, output, quiet, live_text.wanted(stream))  # fmt: skip


def _resume_owned(
    run_name: str,
    directory: Path,
    decided: tuple[str | None, str | None, str | None, str | None, str | None, str],
    state_dir: str | None,
    output: str,
    quiet: bool,
    stream: bool,
) -> NoReturn:
    """Decide (when asked) and go on with a run this process owns."""
    from agentflows.engine import store

    try:
        started = local.SnapshotFile.load(local.snapshot_path(directory, run_name))
        file_store = store.FileStore(local.state_path(directory, run_name))
        checkpoint = file_store.read()
    except (OSError, ValueError) as exc:
        _usage(f"cannot read run {run_name}: {exc}")
    from agentflows.api import requests as human_requests

    pending = human_requests.pending_in(checkpoint.requests, checkpoint.nodes)
    decided_by = decided[-1]
    try:
        fields = _decision_fields(pending, *decided)
    except local.UsageError as exc:
        _usage(str(exc))
    if fields is not None:
        rid, values = fields
        values["decided_at"] = times.timestamp()
        asyncio.run(file_store.decide(rid, **values))
        _err(f"request {rid}: {values['decision']} by {decided_by}")
    run_record = checkpoint.run
    input_value = run_record.input if run_record else None
    _execute(run_name, started, input_value, state_dir, quiet, output, stream)


def _decision_fields(
    pending: dict[str, Any],
    request_id: str | None,
    decision: str | None,
    edits: str | None,
    data: str | None,
    comment: str | None,
    decided_by: str,
) -> tuple[str, dict[str, Any]] | None:
    from agentflows.api import requests as human_requests

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
    decided = request.model_copy(update={**values, "decision": flowrun_api.Decision(decision)})
    problem = human_requests.decision_problem(decided, request.schema_)
    if problem is not None:
        raise local.UsageError(f"request {request_id!r}: {problem}")
    values["decision"] = decision
    return request_id, values


@main.command("operator")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to watch (repeatable; default: $AGENTFLOWS_NAMESPACES, else all).",
)
@click.option("--metrics-port", default=8080, show_default=True, help="Port of /metrics (0: off).")
@click.option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option(
    "--context", "kube_context", help="Kubeconfig context (default: its current-context)."
)
@click.option("--workers", default=32, show_default=True, help="Concurrent reconciles.")
@click.option(
    "--leader-elect",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    show_default=True,
    metavar="[BOOL]",
    help="Work only while holding the Lease, so other replicas stand by (the chart and "
    "config/manager turn it on; off: work alone, as a one-off operator run by hand does).",
)
@click.option("--no-leader-elect", is_flag=True, help="The same as --leader-elect=false.")
@click.option(
    "--leader-election-namespace",
    help="Namespace of the Lease (default: the operator's own, else agentflows-system).",
)
@click.option(
    "--lease-name",
    default="agentflows-operator",
    show_default=True,
    help="Name of the Lease; -shard-<index> is appended when --shard-count is above 1.",
)
@click.option(
    "--shard-index",
    default=0,
    show_default=True,
    help="Reconcile the namespaces whose shard (CRC-32 of the name mod --shard-count) is this.",
)
@click.option(
    "--shard-count", default=1, show_default=True, help="Operators splitting the namespaces."
)
def operator_command(
    namespaces: tuple[str, ...],
    metrics_port: int,
    kubeconfig: str | None,
    kube_context: str | None,
    workers: int,
    leader_elect: bool,
    no_leader_elect: bool,
    leader_election_namespace: str | None,
    lease_name: str,
    shard_index: int,
    shard_count: int,
) -> None:
    """Run the Kubernetes operator (reconciles Agents, Flows and FlowRuns)."""
    import logging

    from agentflows.controller import main as operator_main
    from agentflows.controller import settings as operator_settings
    from agentflows.controller.runtime import leader

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        # built (so its flags are checked) whether or not it is used
        election: leader.LeaderElection | None = operator_settings.leader_election(
            namespace=leader_election_namespace or operator_settings.own_namespace(),
            lease_name=operator_settings.lease_name(lease_name, shard_index, shard_count),
            identity=operator_settings.identity_from_env(),
        )
        if not leader_elect or no_leader_elect:
            election = None
        config = operator_settings.OperatorConfig(
            namespaces=namespaces or operator_settings.namespaces_from_env(),
            runner_image=operator_settings.runner_image_from_env(),
            metrics_port=metrics_port or None,
            workers=workers,
            leader_election=election,
            shard_index=shard_index,
            shard_count=shard_count,
        )
    except operator_settings.SettingsError as exc:
        _usage(str(exc))
    with _cluster_errors(), group.listening("--metrics-port", metrics_port):
        try:
            asyncio.run(operator_main.run(config, kubeconfig, kube_context))
        except leader.LeadershipLost:
            sys.exit(1)  # the elector logged why; a new process stands by again


@main.command("trigger")
@click.option("--flow", "flow_ref", required=True, help="The Flow, as NAMESPACE/NAME.")
@click.option("--trigger", "trigger_name", required=True, help="Name of its schedule trigger.")
@click.option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option(
    "--context", "kube_context", help="Kubeconfig context (default: its current-context)."
)
def trigger_command(
    flow_ref: str, trigger_name: str, kubeconfig: str | None, kube_context: str | None
) -> None:
    """Create the FlowRun of a schedule trigger (the command of the trigger's CronJob pod)."""
    from agentflows.triggers import common as trigger_common
    from agentflows.triggers import schedule

    try:
        with _cluster_errors():
            name = asyncio.run(
                schedule.run_trigger_command(flow_ref, trigger_name, kubeconfig, kube_context)
            )
    except trigger_common.TriggerError as exc:
        _err(f"error: {exc}")
        sys.exit(group.EXIT_INVALID)
    click.echo(name)


@main.command("webhook")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port to listen on.")
@click.option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option(
    "--context", "kube_context", help="Kubeconfig context (default: its current-context)."
)
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Serve only Flows of this namespace (repeatable; default: all namespaces).",
)
def webhook_command(
    host: str,
    port: int,
    kubeconfig: str | None,
    kube_context: str | None,
    namespaces: tuple[str, ...],
) -> None:
    """Serve the webhook receiver: signed POST /hooks/NS/FLOW/TRIGGER start FlowRuns."""
    import logging

    from agentflows.triggers import webhook

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with _cluster_errors(), group.listening("--port", port, host):
        webhook.serve(host, port, kubeconfig, webhook.Settings(namespaces=namespaces), kube_context)


if __name__ == "__main__":
    main()
