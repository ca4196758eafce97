"""``agentflows draft``: describe a Flow in a sentence, get one that validates and has run.

The builder is an Agent run by our own engine: a one-node Flow whose ``agent`` node is the
``flow-builder`` Agent (:func:`builder_agent`), bounded like every run (``limits.maxTokens``,
``limits.maxCostUSD``, the Agent's ``maxToolIterations``), run with the live capabilities. Its
spec declares no tools at all; the host gives it only the belt of
:mod:`agentflows.cli.builder_tools` (validate, dry-run, explain, save, and on a cluster apply),
so it has no python, http or MCP tool of its own. Given a cluster (``-n``, ``--kubeconfig``,
``--context``), it reads and applies as the person's kubeconfig identity; applying shows the
server-side dry run's diff and asks first (:mod:`agentflows.cli.builder_apply`).

What it is told of what exists: the Agents and Flows of the ``-f`` files (their specs, which
name Secrets but never hold a value) and the tools each Agent offers — declared names, and for
``mcp`` tools the names and argument schemas their servers list. When the turn ends the session
prints the last draft that validated, its picture (``agentflows graph``'s Mermaid), its dry run
and what the builder said it assumed. ``--revise FILE`` starts from FILE's Flow and prints the
diff; ``--suggest`` asks for a few Flows worth having and prints each that validated.

Exit codes: 0 a validated draft is printed; 1 the builder ended without one (or its run failed:
a limit, a model error); 2 bad input (no model it can reach, a file that does not load).
"""

from __future__ import annotations

import asyncio
import difflib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from agentflows import api as api_group
from agentflows.api import agent as agent_api
from agentflows.api import documents
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.cli import builder_tools, commands_agentspec, commands_cluster, group, local, views

if TYPE_CHECKING:
    from agentflows.cli import builder_apply

BUILDER = "flow-builder"
#: Recent runs of the namespace ``--suggest`` shows the builder.
RECENT_RUNS = 20
DEFAULT_MODEL = "openai/gpt-4o-mini"
#: How long listing one MCP server's tools may take, in seconds.
MCP_LIST_SECONDS = 10.0

SYSTEM_PROMPT = (
    f"You write agentflows Flows (apiVersion {api_group.API_VERSION}) from a person's "
    "description.\n"
    """A Flow's spec has nodes (each an id plus exactly one of agent {name, prompt}, llm {model
{name}, prompt, outputSchema}, tool {name, args}, transform (a jq expression), branch {value,
cases, default}, map {items, concurrency, agent|tool|flow}, approval {message, approvers
{users, groups}, timeoutSeconds, onTimeout}, input {message, schema}, flow {name, input}),
optional edges [{from, to, branch}] (without edges nodes run in list order), output,
triggers [{name, schedule {cron, timeZone}}], limits and autonomy (readonly, supervised, full).
Expressions are jq: a string starting with "=" is a program over {run, nodes, item}, and
"{{ .run.input.x }}" interpolates inside a string; an agent node's output is
.nodes.<id>.json (parsed) or .nodes.<id>.text.
Use the Agents that exist by name; define a new Agent (kind Agent, spec.model.name,
systemPrompt) in the same YAML only when none fits.
Work with your tools: validate_flow after every change and fix every problem it reports;
explain_resource when unsure of a field; dry_run_flow once it validates; then save_flow.
Your final answer, after the last tool call, lists what you assumed (a model, a schedule's
time zone, an approver), one line each starting with "- ".
"""
)

SUGGEST_TASK = (
    "Propose up to three Flows worth having for the resources and runs below, each with a "
    "distinct name. Validate and dry-run each; do not save them. Say in your final answer why "
    "each is worth having."
)


def _limit_option(
    name: str, default: float, kind: click.IntRange | click.FloatRange, help_text: str
) -> Callable[[Any], Any]:
    """One of the session's bounds: an option with its default shown in ``--help``."""
    return click.option(name, default=default, show_default=True, type=kind, help=help_text)


def _usage(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(group.EXIT_INVALID)


def builder_agent(model: agent_api.ModelSpec, max_iterations: int) -> agent_api.AgentSpec:
    """The builder's Agent: a system prompt and a model, no tools of its own."""
    return agent_api.AgentSpec(
        model=model, system_prompt=SYSTEM_PROMPT, max_tool_iterations=max_iterations
    )


def builder_flow(max_tokens: int, max_cost: float) -> flow_api.FlowSpec:
    """The one-node Flow the builder runs in, with the session's token and cost limits."""
    return flow_api.FlowSpec.model_validate(
        {
            "input": {"type": "object", "properties": {"request": {"type": "string"}}},
            "nodes": [
                {"id": "draft", "agent": {"name": BUILDER, "prompt": "{{ .run.input.request }}"}}
            ],
            "limits": {"maxTokens": max_tokens, "maxCostUSD": max_cost, "maxNodeExecutions": 1},
            "autonomy": "full",
            "output": "=.nodes.draft.text",
        }
    )


def _resource_yaml(resource: Any) -> str:
    return views.dump(
        {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"name": resource.metadata.name},
            "spec": resource.spec.to_wire(),
        },
        "yaml",
    )


async def _mcp_tools(tool: agent_api.Tool) -> str:
    """One line per tool an ``mcp`` tool's server lists: its name and argument schema."""
    import json

    from agentflows.agents import mcp, secrets

    provider = mcp.McpToolProvider(tool, os.environ, secrets.Redactor(), MCP_LIST_SECONDS)
    try:
        listed = await provider.list_tools()
    except Exception as exc:  # any failure is a note for the builder, not a crash
        return f"  - {tool.name}: its server could not be listed ({type(exc).__name__}: {exc})"
    finally:
        await provider.aclose()
    return "\n".join(
        f"  - {d.name}: {d.description[:200]} args {json.dumps(d.parameters or {})}" for d in listed
    )


async def describe_existing(loaded: documents.LoadResult) -> str:
    """What exists, for the builder: every Agent and Flow, and the tools each Agent offers."""
    from agentflows.agents import spec_tools

    kept = [*loaded.of_kind(agent_api.Agent), *loaded.of_kind(flow_api.Flow)]
    parts = [_resource_yaml(r) for r in kept]
    lines = []
    for agent in loaded.of_kind(agent_api.Agent):
        lines.append(f"Agent {agent.metadata.name} offers its model these tools:")
        lines += [f"  - {name}" for name in spec_tools.declared_tool_names(agent.spec)]
        for tool in agent.spec.tools:
            if tool.mcp is not None:
                lines.append(await _mcp_tools(tool))
    listing = "\n---\n".join(parts) or "(nothing: define the Agents the Flow needs)"
    return f"What exists:\n```yaml\n{listing}\n```\n" + "\n".join(lines)


def _model(name: str, api_base: str | None) -> agent_api.ModelSpec:
    from agentflows.agents import mock

    try:
        model = agent_api.ModelSpec(name=name, api_base=api_base)
    except ValueError as exc:
        _usage(f"--model/--api-base: {exc}")
    if mock.needs_mock(model, os.environ):
        _usage(
            f"the builder needs a model it can reach: export the provider's key for {name} "
            "(e.g. OPENAI_API_KEY) or give --api-base (a local OpenAI-compatible server)"
        )
    return model


def _confirm(path: Path) -> bool:
    """Ask the person at a terminal; nobody to ask (no terminal) is a no."""
    return _ask("", f"Save the draft Flow to {path}?")


def _ask(shown: str, question: str) -> bool:
    """Show ``shown`` (a diff) on stderr and ask ``question`` at a terminal; no terminal: no."""
    if not sys.stdin.isatty():
        return False
    if shown:
        click.echo(shown.rstrip("\n"), err=True)
    return click.confirm(question, default=False, err=True)


async def _run(
    request: str, belt: builder_tools.Belt, agent: agent_api.AgentSpec, flow: flow_api.FlowSpec
) -> Any:
    from agentflows.agents import host
    from agentflows.engine import graph, run, store

    resolver = graph.StaticResolver({BUILDER: agent}, {"draft": flow})
    caps = host.LiveCapabilities(resolver, builtin_tools={BUILDER: [belt]})
    try:
        return await run.run_flow(
            graph.compile_flow(flow, resolver),
            run_name="draft",
            input_value={"request": request},
            store_=store.MemoryStore(),
            caps=caps,
            resolver=resolver,
        )
    finally:
        if belt.applier is not None:
            await belt.applier.api.close()


def _print_draft(
    belt: builder_tools.Belt, draft: builder_tools.Draft, original: str | None
) -> None:
    """The YAML (or the diff from ``original``), the picture, and the dry run."""
    from agentflows import diagram

    where = f"saved to {belt.saved}" if belt.saved else "not saved (give -o FILE to save it)"
    click.echo(f"# Flow {draft.flow.metadata.name}: validated, {where}")
    click.echo(draft.yaml.rstrip("\n"))
    if original is not None:
        click.echo("\n# Changes")
        diff = difflib.unified_diff(
            original.splitlines(keepends=True),
            draft.yaml.splitlines(keepends=True),
            "before",
            "after",
        )
        click.echo("".join(diff).rstrip("\n") or "(no change)")
    click.echo("\n# Picture (agentflows graph)\n```mermaid")
    click.echo(diagram.mermaid(draft.flow.spec, None, flows=draft.resolver.flows).rstrip("\n"))
    click.echo("```")
    result = belt.dry_run if belt.dry_run_yaml == draft.yaml else None
    if result is None:
        result = asyncio.run(builder_tools.dry_run(draft))
    click.echo("\n# Dry run (mock model and tools)")
    click.echo(views.dump(result, "yaml"))


def _finish(
    outcome: Any, belt: builder_tools.Belt, original: str | None, suggest: bool
) -> NoReturn:
    drafts = list(belt.drafts.values()) if suggest else [belt.valid] if belt.valid else []
    for draft in drafts:
        _print_draft(belt, draft, original)
        click.echo("")
    if belt.applier is not None:
        for refusal in belt.applier.refused:
            click.echo(f"apply_flow: {refusal}", err=True)
        if belt.applier.applied:
            applied = ", ".join(belt.applier.applied)
            click.echo(f"# Applied to namespace {belt.applier.namespace}: {applied}\n")
    answer = outcome.output if isinstance(outcome.output, str) else None
    if answer:
        click.echo("# Assumed" if not suggest else "# Why")
        click.echo(str(answer).strip())
    usage = outcome.usage
    click.echo(
        f"builder: {usage.llm_calls} model call(s), {usage.tool_calls} tool call(s), "
        f"{usage.prompt_tokens + usage.completion_tokens} tokens, ${usage.cost_usd:.4f}",
        err=True,
    )
    if outcome.phase is not flowrun_api.RunPhase.SUCCEEDED:
        click.echo(f"error: the builder stopped: {outcome.message}", err=True)
        sys.exit(group.EXIT_FAILED)
    if not drafts:
        last = belt.problems_seen[-1] if belt.problems_seen else ["it never called validate_flow"]
        click.echo("error: the builder ended without a draft that validates:", err=True)
        for line in last:
            click.echo(f"  {line}", err=True)
        sys.exit(group.EXIT_FAILED)
    sys.exit(0)


async def _namespace(api: Any, namespace: str, runs: bool) -> tuple[documents.LoadResult, str]:
    """The Agents and Flows of ``namespace`` as the person may read them (and its recent runs).

    Only specs are kept (never a Secret: none is read); a resource that does not parse is left
    out, as the builder may only build on what validates.
    """
    from agentflows import api as api_group
    from agentflows.kube import client as kube

    loaded = documents.LoadResult(sources=[f"namespace {namespace}"])
    for plural, kind in (("agents", "Agent"), ("flows", "Flow")):
        listed = await api.get(kube.path_of(plural, namespace))
        for item in listed.get("items") or []:
            name = (item.get("metadata") or {}).get("name")
            document = {
                "apiVersion": api_group.API_VERSION,
                "kind": kind,
                "metadata": {"name": name, "namespace": namespace},
                "spec": item.get("spec") or {},
            }
            resource, problems = documents.parse_resource(document, f"{namespace}/{kind} {name}")
            if resource is not None and not problems:
                loaded.add(resource, f"{namespace}/{kind} {name}")
    if not runs:
        return loaded, ""
    listed = await api.get(kube.path_of("flowruns", namespace))
    items = sorted(
        listed.get("items") or [],
        key=lambda r: (r.get("metadata") or {}).get("creationTimestamp") or "",
        reverse=True,
    )[:RECENT_RUNS]
    lines = [_run_line(r) for r in items]
    return loaded, "Recent runs (newest first):\n" + ("\n".join(lines) or "(none)")


def _run_line(run: dict[str, Any]) -> str:
    """A recent run as the builder is told of it: name, Flow, phase and why."""
    status = flowrun_api.status_of(run)
    line = f"- FlowRun {run['metadata'].get('name')}: Flow {(run.get('spec') or {}).get('flow')}, "
    line += status.phase.value if status.phase else "Pending"
    return line + (f": {status.message[:200]}" if status.message else "")


def _from_cluster(
    namespace: str | None, kubeconfig: str | None, kube_context: str | None, runs: bool
) -> tuple[documents.LoadResult, str]:
    """:func:`_namespace` with the person's kubeconfig identity (exit 2 when it cannot be read)."""
    from agentflows.kube import client as kube

    api = commands_cluster._client(kubeconfig, kube_context)
    ns = namespace or api.config.namespace

    async def read() -> tuple[documents.LoadResult, str]:
        async with api:
            return await _namespace(api, ns, runs)

    try:
        return asyncio.run(read())
    except kube.ApiError as exc:
        _usage(f"cannot read namespace {ns}: {exc}")


def _applier(
    namespace: str | None, kubeconfig: str | None, kube_context: str | None
) -> builder_apply.Applier:
    """``apply_flow``'s applier, with the person's kubeconfig identity."""
    from agentflows.cli import builder_apply

    api = commands_cluster._client(kubeconfig, kube_context)
    return builder_apply.Applier(api, namespace or api.config.namespace, _ask)


def _load(files: tuple[Path, ...], revise: Path | None) -> tuple[documents.LoadResult, str | None]:
    """The existing resources, and the text of the Flow to revise (left out of them)."""
    loaded = commands_agentspec.load_paths(files) if files else documents.LoadResult()
    original = None
    if revise is not None:
        original = revise.read_text()
        revised = documents.load_text(original, str(revise))
        if not revised.of_kind(flow_api.Flow):
            _usage(f"--revise {revise}: the file holds no Flow")
        for resource in revised.resources:
            if not isinstance(resource, flow_api.Flow):
                loaded.add(resource, revised.label_of(resource))
    problems = local.validate_loaded(loaded)
    if problems:
        for problem in problems:
            click.echo(str(problem), err=True)
        _usage(f"{len(problems)} problem(s) in the files given (-f): fix them first")
    return loaded, original


@click.command("draft")
@click.argument("prompt", required=False, default="")
@click.option(
    "-f",
    "--file",
    "files",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Agent and Flow files (or directories) the draft may use.",
)
@click.option(
    "--model",
    default=lambda: os.environ.get("AGENTFLOWS_BUILDER_MODEL", DEFAULT_MODEL),
    help=f"The builder's litellm model (default $AGENTFLOWS_BUILDER_MODEL or {DEFAULT_MODEL}).",
)
@click.option(
    "--api-base",
    default=lambda: os.environ.get("AGENTFLOWS_BUILDER_API_BASE"),
    help="An OpenAI-compatible server for the model ($AGENTFLOWS_BUILDER_API_BASE).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where save_flow writes the draft (without it: asked at a terminal).",
)
@click.option(
    "--revise",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Change the Flow of this file as PROMPT says, and show the diff.",
)
@click.option(
    "--suggest", is_flag=True, help="Propose a few Flows for the given resources (and runs, -n)."
)
@commands_cluster.namespace_option
@commands_cluster.kubeconfig_option
@commands_cluster.context_option
@_limit_option(
    "--max-iterations",
    12,
    click.IntRange(1, 200),
    "Model turns with tool calls before the builder gives up.",
)
@_limit_option("--max-tokens", 200_000, click.IntRange(1), "Token limit of the session.")
@_limit_option("--max-cost", 1.0, click.FloatRange(0), "Cost limit of the session, in USD.")
def draft_command(
    prompt: str,
    files: tuple[Path, ...],
    model: str,
    api_base: str | None,
    output: Path | None,
    revise: Path | None,
    suggest: bool,
    namespace: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
    max_iterations: int,
    max_tokens: int,
    max_cost: float,
) -> None:
    """Draft a Flow from PROMPT with the builder agent: validated, dry-run, saved with -o.

    The builder reads the Agents and Flows of the -f files and the tools their MCP servers
    list (names and schemas, never a Secret's value), proposes a Flow, and loops on
    validate / dry-run until it is right. It ends printing the YAML, its Mermaid picture, the
    dry run and what it assumed. Exit 0 with a validated draft, 1 without one.
    """
    if not prompt and not suggest:
        _usage('give PROMPT (what the Flow should do), e.g. agentflows draft "every weekday ..."')
    if suggest and (revise is not None or output is not None):
        _usage("--suggest only proposes Flows: it takes neither --revise nor -o")
    spec = _model(model, api_base)
    loaded, original = _load(files, revise)
    runs = ""
    belt = builder_tools.Belt(loaded, output, _confirm)
    if namespace is not None or kubeconfig is not None or kube_context is not None:
        in_cluster, runs = _from_cluster(namespace, kubeconfig, kube_context, suggest)
        loaded.extend(in_cluster)
        if not suggest:
            belt.applier = _applier(namespace, kubeconfig, kube_context)
    task = SUGGEST_TASK if suggest else f"The person asks for this Flow:\n{prompt}"
    if original is not None:
        task = f"Revise this Flow as the person asks: {prompt}\n```yaml\n{original}\n```"
    if output is None and not suggest:
        task += "\n(The person gave no -o FILE: give save_flow a path to ask them.)"
    request = f"{task}\n\n{asyncio.run(describe_existing(loaded))}\n{runs}".rstrip("\n")
    outcome = asyncio.run(
        _run(request, belt, builder_agent(spec, max_iterations), builder_flow(max_tokens, max_cost))
    )
    _finish(outcome, belt, original, suggest)


COMMANDS = [draft_command]
