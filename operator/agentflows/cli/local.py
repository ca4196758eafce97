"""Local runs: a flow from files, a file checkpoint store, and a snapshot for ``resume``.

``agentflows run`` writes two files per run under the state directory: ``<run>.json`` (the
checkpoint store) and ``<run>.snapshot.json`` (the Flow and Agents as they were at the start,
and whether the run used the mock model). ``agentflows resume`` reads both, so editing a file
after a run started never changes that run — the same rule the operator applies in a cluster.

A run name is a DNS-1123 label (:func:`check_run_name`), as a FlowRun's name would be on a
cluster: it can never name a path outside the state directory, and ``<run>.snapshot.json``
and the store's temporary files always fit in a file name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentflows.api import agent as agent_api
from agentflows.api import calls, documents
from agentflows.api import flow as flow_api
from agentflows.api import snapshot as snapshot_api
from agentflows.cli import group
from agentflows.engine import capabilities, graph

if TYPE_CHECKING:
    from agentflows.agents import sessions

DEFAULT_STATE_DIR = ".agentflows/runs"
#: Longest run name: a DNS-1123 label's 63 characters.
MAX_RUN_NAME = 63
_RUN_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: Characters a generated run name cannot hold, replaced by "-".
_NOT_IN_NAME = re.compile(r"[^a-z0-9-]+")
SNAPSHOT_SUFFIX = ".snapshot.json"


#: The command was called wrongly (exit 2); owned by :mod:`agentflows.cli.group`.
UsageError = group.UsageError


def state_dir(option: str | None) -> Path:
    """The directory local runs are kept in."""
    return Path(option or os.environ.get("AGENTFLOWS_STATE_DIR") or DEFAULT_STATE_DIR)


#: The folder of the state directory holding local sessions (``agentflows sessions``).
SESSIONS_FOLDER = "sessions"


def session_store(directory: Path) -> sessions.Store:
    """The local session store of the state directory ``directory``."""
    from agentflows.agents import session_files

    return session_files.FileStore(directory / SESSIONS_FOLDER)


def state_path(directory: Path, name: str) -> Path:
    """The checkpoint file of run ``name`` (a UsageError when ``name`` is not a run name)."""
    return directory / f"{check_run_name(name)}.json"


def snapshot_path(directory: Path, name: str) -> Path:
    """The snapshot file of run ``name`` (its presence is what makes ``name`` a run)."""
    return directory / f"{check_run_name(name)}{SNAPSHOT_SUFFIX}"


def is_run(directory: Path, name: str) -> bool:
    """Whether ``directory`` holds run ``name`` (False for a name no local run can have)."""
    try:
        return snapshot_path(directory, name).is_file()
    except UsageError:
        return False


def lock_path(directory: Path, name: str) -> Path:
    """The lock file of run ``name``, held by the one process running it (:mod:`.run_lock`)."""
    return directory / f"{check_run_name(name)}.lock"


def check_run_name(name: str) -> str:
    """``name`` when it is a valid run name, else a UsageError that says what is valid.

    Every file of a run is named through this check (:func:`state_path`, :func:`snapshot_path`,
    :func:`lock_path`), so no command or console page can reach a path from a run name.
    """
    if len(name) > MAX_RUN_NAME or not _RUN_NAME.match(name):
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise UsageError(
            f"{shown!r} is not a run name: a run name is at most {MAX_RUN_NAME} lower-case "
            "letters, digits and '-', starting and ending with a letter or digit (e.g. research-1)"
        )
    return name


@dataclasses.dataclass(frozen=True)
class SnapshotFile:
    """A local run's ``<run>.snapshot.json``: its snapshot, and how the local run runs.

    The file is the snapshot's :attr:`~agentflows.api.snapshot.Snapshot.document` with two more
    keys, ``mock`` and ``files_root`` (in that order, indented by one).
    """

    snapshot: snapshot_api.Snapshot
    #: Whether the run uses the mock model (no model had a key when it started).
    mock: bool
    #: Directory of the Flow's file: reference files' paths are relative to it (and stay in it).
    files_root: str = ""

    def save(self, path: Path) -> None:
        """Write the snapshot file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {**self.snapshot.document, "mock": self.mock, "files_root": self.files_root}
        path.write_text(json.dumps(document, indent=1))

    @classmethod
    def load(cls, path: Path) -> SnapshotFile:
        """Read a snapshot file; a file that is not one is a ValueError naming it."""
        try:
            document = json.loads(path.read_text())
            snapshot = snapshot_api.Snapshot.from_document(document)
            unknown = sorted(set(document) - {*snapshot.document, *_RUN_KEYS})
            if unknown or "mock" not in document:
                raise ValueError(f"keys {unknown} are unknown" if unknown else "'mock' is missing")
        except ValueError as exc:
            raise ValueError(f"{path}: not a run snapshot: {exc}") from None
        return cls(snapshot, document["mock"], document.get("files_root", ""))


#: The keys of a snapshot file that are not the snapshot's.
_RUN_KEYS = ("mock", "files_root")


def files_root(loaded: documents.LoadResult, flow: flow_api.Flow) -> str:
    """The directory of the file ``flow`` was read from (the current one when unknown)."""
    label = loaded.label_of(flow)
    source = Path(label.rsplit("#", 1)[0]) if "#" in label else Path("flow")
    return str(source.resolve().parent)


def resolver_of(loaded: documents.LoadResult) -> graph.StaticResolver:
    """A resolver over the Agents and Flows in loaded files."""
    agents = {a.metadata.name or "": a.spec for a in loaded.of_kind(agent_api.Agent)}
    flows = {f.metadata.name or "": f.spec for f in loaded.of_kind(flow_api.Flow)}
    return graph.StaticResolver(agents, flows)


def validate_loaded(loaded: documents.LoadResult) -> list[documents.Problem]:
    """Every problem of the loaded files in one pass: parse problems, then each resource's own.

    Each problem is located as ``FILE#DOC (Kind name): path: message``.
    """
    problems = list(loaded.problems)
    resolver = resolver_of(loaded)
    for resource in loaded.resources:
        found: list[documents.Problem] = []
        if isinstance(resource, flow_api.Flow):
            found = graph.validate(resource.spec, resolver, name=resource.metadata.name)
        elif isinstance(resource, agent_api.Agent):
            found = graph.validate_agent(resource.spec)
        elif resolver.flow(resource.spec.flow) is None and loaded.of_kind(flow_api.Flow):
            found = [documents.Problem("spec.flow", f'no Flow "{resource.spec.flow}"')]
        label = loaded.label_of(resource)
        problems += [dataclasses.replace(problem, source=label) for problem in found]
    return problems


def pick_flow(loaded: documents.LoadResult, name: str | None) -> flow_api.Flow:
    """The flow to run: the one named, or the only one in the files."""
    flows = loaded.of_kind(flow_api.Flow)
    have = graph.names(f.metadata.name or "(unnamed)" for f in flows)
    if not flows:
        files = ", ".join(s for s in loaded.sources if s) or "the input"
        raise UsageError(f"no Flow in {files}")
    if name is not None:
        for candidate in flows:
            if candidate.metadata.name == name:
                return candidate  # type: ignore[no-any-return]
        raise UsageError(f'no Flow "{name}" in the files (have: {have})')
    if len(flows) != 1:
        raise UsageError(
            f"the files hold {len(flows)} Flows; choose one with --flow (have: {have})"
        )
    return flows[0]  # type: ignore[no-any-return]


def parse_inputs(pairs: tuple[str, ...], json_text: str | None) -> Any:
    """Build the run input from ``--input k=v`` pairs (values parsed as JSON when they are)."""
    value: dict[str, Any] = {}
    if json_text is not None:
        loaded = _input_json(json_text, "--input-json")
        if pairs and not isinstance(loaded, dict):
            raise UsageError("--input-json must be an object when --input is also given")
        if not pairs:
            return loaded
        value.update(loaded)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--input {pair!r}: expected KEY=VALUE")
        try:
            value[key] = _input_json(raw, f"--input {key}")
        except _NotJson:
            value[key] = raw
    return value


class _NotJson(UsageError):
    """The text is not JSON at all (an ``--input`` value is then taken as a string)."""


def _input_json(text: str, option: str) -> Any:
    """Parse JSON given on the command line; refuse what the run state could not hold."""
    try:
        loaded = json.loads(text)
    except RecursionError:
        raise UsageError(f"{option}: nested too deeply") from None
    except ValueError as exc:
        raise _NotJson(f"{option} is not JSON: {exc}") from None
    try:
        # a lone surrogate (\ud800) parses but cannot be written as UTF-8 anywhere
        json.dumps(loaded, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{option}: holds a lone surrogate escape (\\ud800-\\udfff); "
            "JSON text must be valid Unicode"
        ) from None
    except RecursionError:
        raise UsageError(f"{option}: nested too deeply") from None
    return loaded


def new_run_name(flow_name: str) -> str:
    """A generated run name, like Kubernetes generateName: ``<flow>-<6 hex>``, always valid.

    The flow's name is made a valid label first (lower case, other characters as "-") and cut
    so the whole name stays within :data:`MAX_RUN_NAME`.
    """
    suffix = secrets.token_hex(3)
    stem = _NOT_IN_NAME.sub("-", flow_name.lower()).strip("-")
    stem = stem[: MAX_RUN_NAME - len(suffix) - 1].rstrip("-") or "run"
    return f"{stem}-{suffix}"


def models_used(flow: str, resolver: capabilities.Resolver) -> list[agent_api.ModelSpec]:
    """Every model Flow ``flow`` may call: its llm nodes' and every Agent's turn it reaches.

    Only calls that run are followed (:func:`calls.running`): a tool node calls one tool of its
    Agent, never the Agent's model.
    """
    reached = calls.reach(flow, resolver, calls.running)
    models = [node.llm.model for spec in reached.flows.values() for node in spec.nodes if node.llm]
    return models + [agent.model for agent in reached.agents.values()]


def missing_credentials(models: list[agent_api.ModelSpec], env: Mapping[str, str]) -> list[str]:
    """Model names that have no key and no apiBase configured (so the mock stands in)."""
    if not models:
        return []
    from agentflows.agents import mock

    return sorted({m.name for m in models if mock.needs_mock(m, env)})
