"""Open Agent Spec on the command line: ``import``, ``export``, and Agent Spec files for ``run``.

``agentflows run spec.yaml`` and ``agentflows validate spec.json`` read Agent Spec documents
through :func:`load_paths`, which imports them into the Agent and Flow resources the rest of
the CLI works with (so a run of an Agent Spec file has the same progress lines, exit codes,
``--dry-run`` and ``resume`` as any other). ``import`` prints those resources as YAML for
``kubectl apply``; ``export`` writes a Flow (with its Agents and sub-flows) as Agent Spec.

The Agent Spec modules are imported where they are used: every ``agentflows`` command imports
this module, and the runner pod's should not pay for them before its first node.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import click
import yaml

from agentflows.api import documents, kubeyaml
from agentflows.cli import group, local


@dataclasses.dataclass
class SpecLoadResult(documents.LoadResult):
    """A LoadResult that also knows which Flow each Agent Spec document runs."""

    spec_flows: list[str] = dataclasses.field(default_factory=list)


def _spec_text(path: Path) -> str | None:
    """The text of ``path`` when it holds an Agent Spec document, else None."""
    from agentflows.agentspec import document

    if path.is_dir() or path.suffix not in (".json", ".yaml", ".yml"):
        return None
    try:
        text = path.read_bytes().decode()
        loaded = kubeyaml.load_all(text)
    except (OSError, UnicodeDecodeError, kubeyaml.YamlError):
        return None  # documents.load_paths reports it
    if len(loaded) == 1 and document.is_agentspec(loaded[0].value):
        return text
    return None


#: ``--tools MODULE`` of run, validate and import: ServerTool implementations.
tools_option = click.option(
    "--tools",
    "tools_module",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Python module whose public functions implement the ServerTools of their names.",
)


def implementations(tools_module: Path | None, *, dry_run: bool = False) -> Any:
    """The ServerTool implementations of ``--tools`` (and ``--dry-run``); exit 2 on a bad module."""
    from agentflows.agentspec import implementations as impl

    if tools_module is None:
        return impl.Implementations(mock_missing=dry_run)
    try:
        module = impl.read_module(tools_module)
    except impl.ModuleError as exc:
        _fail([documents.Problem("", str(exc), str(tools_module))])
    return impl.Implementations.of_module(module, mock_missing=dry_run)


def import_file(path: Path, result: SpecLoadResult, text: str, impl: Any = None) -> None:
    """Import one Agent Spec file into ``result`` (its resources, or its problems)."""
    from agentflows.agentspec import errors, implementations, importer

    result.sources.append(str(path))
    try:
        imported = importer.import_text(text, impl or implementations.NONE)
    except errors.SpecInvalid as exc:
        result.problems += [dataclasses.replace(p, source=str(path)) for p in exc.problems]
        return
    for resource in imported.resources():
        result.add(
            resource,
            f"{path} (Agent Spec {imported.version}: {resource.kind} {resource.metadata.name})",
        )
    result.spec_flows.append(imported.flow)


def load_paths(paths: Iterable[Path], impl: Any = None) -> SpecLoadResult:
    """Load files as ``documents.load_paths`` does, importing Agent Spec documents among them.

    In a directory, every ``.json``, ``.yaml`` or ``.yml`` file (sub-directories included)
    holding an Agent Spec document is imported; its other YAML files load as resources.
    """
    result = SpecLoadResult()
    others = []
    specs: list[Path] = []
    for path in paths:
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        found = [(f, text) for f in files if (text := _spec_text(f)) is not None]
        for file, text in found:
            import_file(file, result, text, impl)
        specs += [file for file, _text in found]
        if path.is_dir() or not found:
            others.append(path)
    if others:
        result.extend(documents.load_paths(others, exclude=specs))
    return result


def flow_to_run(loaded: documents.LoadResult) -> str | None:
    """The Flow an Agent Spec document runs, when the files hold exactly one such document."""
    if isinstance(loaded, SpecLoadResult) and len(loaded.spec_flows) == 1:
        return loaded.spec_flows[0]
    return None


def _fail(problems: Iterable[documents.Problem]) -> NoReturn:
    count = 0
    for problem in problems:
        click.echo(str(problem), err=True)
        count += 1
    click.echo(f"{count} problem(s) found", err=True)
    sys.exit(group.EXIT_INVALID)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (scripts, prompts) as literal blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
    )


_Dumper.add_representer(str, _string)


def dump(value: Any, *, many: bool = False) -> str:
    """YAML as the commands print it: keys in order, long lines kept, scripts as blocks."""
    options: dict[str, Any] = {"sort_keys": False, "width": 1_000_000, "allow_unicode": True}
    if many:
        return str(yaml.dump_all(value, Dumper=_Dumper, explicit_start=True, **options))
    return str(yaml.dump(value, Dumper=_Dumper, **options))


def render(resources: Iterable[Any]) -> str:
    """Resources as multi-document YAML, without the fields left at their defaults."""
    docs = []
    for resource in resources:
        wire = resource.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude_defaults=True
        )
        docs.append({"apiVersion": resource.api_version, "kind": resource.kind, **wire})
    return dump(docs, many=True)


@click.command("import")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--namespace", "-n", help="Set metadata.namespace on every resource.")
@tools_option
def import_command(spec: Path, namespace: str | None, tools_module: Path | None) -> None:
    """Print an Agent Spec document as Agent and Flow YAML (pipe to kubectl apply -f -).

    With --tools, each ServerTool's script embeds the module and calls its function.
    """
    impl = implementations(tools_module)
    result = SpecLoadResult()
    try:
        text = spec.read_bytes().decode()
    except UnicodeDecodeError:
        _fail([documents.Problem("", "not UTF-8 text (save the file as UTF-8)", str(spec))])
    import_file(spec, result, text, impl)
    problems = local.validate_loaded(result)
    if problems:
        _fail(problems)
    for resource in result.resources:
        resource.metadata.namespace = namespace or resource.metadata.namespace
    click.echo(render(result.resources), nl=False)


@click.command("export")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--flow", "flow_name", help="Flow to export when the files hold several.")
@click.option(
    "--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", help="Output format."
)
def export_command(files: tuple[Path, ...], flow_name: str | None, fmt: str) -> None:
    """Write a Flow of FILES (with its Agents and sub-flows) as an Agent Spec document."""
    from agentflows.agentspec import errors, exporter

    loaded = load_paths(files)
    problems = local.validate_loaded(loaded)
    if problems:
        _fail(problems)
    try:
        chosen = local.pick_flow(loaded, flow_name or _only_caller(loaded))
    except local.UsageError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(group.EXIT_INVALID)
    try:
        spec = exporter.export(chosen.metadata.name or "", local.resolver_of(loaded))
    except errors.SpecInvalid as exc:
        _fail(dataclasses.replace(p, source=loaded.label_of(chosen)) for p in exc.problems)
    if fmt == "json":
        click.echo(json.dumps(spec, indent=2))
    else:
        click.echo(dump(spec), nl=False)


def _only_caller(loaded: documents.LoadResult) -> str | None:
    """The one Flow no other Flow of the files calls (the top of a flow with sub-flows)."""
    from agentflows.api import flow as flow_api

    flows = loaded.of_kind(flow_api.Flow)
    called = {
        call.name
        for f in flows
        for node in f.spec.nodes
        for call in (node.flow, node.map.flow if node.map else None)
        if call is not None
    }
    tops = [f.metadata.name for f in flows if f.metadata.name not in called]
    return tops[0] if len(tops) == 1 and len(flows) > 1 else None


COMMANDS = [import_command, export_command]
