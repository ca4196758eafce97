"""Load Agent, Flow and FlowRun documents from YAML, turning every error into a Problem.

A Problem names where it is (file, document, and a dotted path such as
``spec.nodes[3].branch.cases.bug``) and what is wrong, in one line. Loading never stops at the
first problem: a user fixing a file sees them all at once.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import pydantic

from agentflows import api as api_group
from agentflows.api import agent, common, flow, flowrun, kubeyaml

#: Largest file read, and largest total of a file's values with YAML aliases expanded.
MAX_DOCUMENT_BYTES = kubeyaml.MAX_EXPANDED


def safe_load_all(text: str) -> list[Any]:
    """Parse a YAML stream as kubectl does, dropping empty documents; raise kubeyaml.YamlError.

    Like kubectl (YAML 1.1), an unquoted ``yes`` or ``on`` is true; a key that becomes a
    boolean or a number is turned into its string, so ``cases: {true: x}`` works and a file
    means the same locally as it does in a cluster.
    """
    return [document.value for document in kubeyaml.load_all(text)]


Resource = agent.Agent | flow.Flow | flowrun.FlowRun
_KINDS: dict[str, type[agent.Agent] | type[flow.Flow] | type[flowrun.FlowRun]] = {
    "Agent": agent.Agent,
    "Flow": flow.Flow,
    "FlowRun": flowrun.FlowRun,
}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located by a path."""

    path: str
    message: str
    source: str = ""

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        # one line per problem, whatever a parser's message spans (libyaml's quote the input)
        message = " ".join(self.message.split())
        return f"{where}{self.path}: {message}" if self.path else f"{where}{message}"


def format_loc(loc: Iterable[int | str]) -> str:
    """Turn a pydantic error location into ``spec.nodes[3].branch``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _skip_loc_part(part: int | str) -> bool:
    # pydantic adds validator and union tags such as "function-after[...]" to locations
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def validation_problems(exc: pydantic.ValidationError, prefix: str = "") -> list[Problem]:
    """Convert a pydantic ValidationError into Problems with wire (camelCase) paths."""
    problems = []
    for error in exc.errors():
        loc = [p for p in error["loc"] if not _skip_loc_part(p)]
        path = format_loc([*([prefix] if prefix else []), *loc])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
            if loc and loc[-1] in ("true", "false"):
                message += " (YAML reads an unquoted on, off, yes, no, y or n as a boolean)"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        elif error["type"].endswith("_type") and isinstance(error["input"], (str, int, float)):
            message += f" (got {json.dumps(error['input'])[:40]})"
        problems.append(Problem(path, message))
    return problems


@dataclasses.dataclass
class LoadResult:
    """What a set of documents held: the resources that parsed, and every problem.

    ``labels`` locates each resource as ``FILE#DOC (Kind name)`` for the problems found later;
    ``sources`` are the files read and ``skipped`` what was not checked, and why.
    """

    resources: list[Resource] = dataclasses.field(default_factory=list)
    problems: list[Problem] = dataclasses.field(default_factory=list)
    labels: dict[int, str] = dataclasses.field(default_factory=dict)
    sources: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)

    def of_kind(self, kind: type[Any]) -> list[Any]:
        """The resources of one model class."""
        return [r for r in self.resources if isinstance(r, kind)]

    def label_of(self, resource: Resource) -> str:
        """Where a resource came from: ``FILE#DOC (Kind name)``."""
        return self.labels.get(id(resource), f"{resource.kind} {resource.metadata.name}")

    def add(self, resource: Resource, label: str) -> None:
        """Keep a parsed resource with its location."""
        self.resources.append(resource)
        self.labels[id(resource)] = label

    def extend(self, other: LoadResult) -> None:
        """Take in everything another result holds."""
        for resource in other.resources:
            self.add(resource, other.label_of(resource))
        self.problems.extend(other.problems)
        self.sources.extend(other.sources)
        self.skipped.extend(other.skipped)


def parse_resource(document: Any, source: str = "") -> tuple[Resource | None, list[Problem]]:
    """Validate one decoded document against the model its ``kind`` names.

    Types are checked strictly, as the API server checks them (``"4"`` is not an integer), and
    ``metadata`` as the API server checks it (a valid name, which a Flow needs short).
    """
    if not isinstance(document, dict):
        return None, [Problem("", "a document must be a mapping with apiVersion and kind", source)]
    kind = document.get("kind")
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None, [
            Problem("kind", f"unknown kind {kind!r}; expected one of Agent, Flow, FlowRun", source)
        ]
    api_version = document.get("apiVersion")
    if api_version != api_group.API_VERSION:
        return None, [
            Problem("apiVersion", f"{api_version!r} is not {api_group.API_VERSION}", source)
        ]
    problems = [dataclasses.replace(p, source=source) for p in _metadata_problems(document)]
    try:
        return model.model_validate_json(json.dumps(document), strict=True), problems
    except pydantic.ValidationError as exc:
        problems += [dataclasses.replace(p, source=source) for p in validation_problems(exc)]
        return _salvaged(model, document, exc), problems


def _metadata_problems(document: dict[str, Any]) -> list[Problem]:
    metadata = document.get("metadata", {})
    if not isinstance(metadata, dict):
        return []  # the model reports a metadata that is not a mapping
    name = metadata.get("name")
    if document["kind"] == "FlowRun" and name is None:
        prefix = metadata.get("generateName")
        if prefix is None:
            return [Problem("metadata.name", "required: set name or generateName")]
        problem = common.name_problem(f"{prefix}x" if isinstance(prefix, str) else prefix)
        return [Problem("metadata.generateName", problem)] if problem else []
    limit = common.FLOW_NAME_MAX if document["kind"] == "Flow" else common.NAME_MAX
    problem = common.name_problem(name, limit)
    if problem and document["kind"] == "Flow" and isinstance(name, str):
        problem += " (a Flow's name is a label value on its runs)"
    return [Problem("metadata.name", problem)] if problem else []


def _salvaged(
    model: type[agent.Agent] | type[flow.Flow] | type[flowrun.FlowRun],
    document: dict[str, Any],
    exc: pydantic.ValidationError,
) -> Resource | None:
    """The resource with the parts that failed set aside, so the rest is still checked.

    The problems are reported either way (and nothing runs); this only keeps one misspelled key
    or wrong type from hiding every graph problem behind it. Unknown fields are dropped, a
    Flow's optional spec field that failed falls back to its default, and a node that failed
    becomes a placeholder with the same id (its edges stay). A failed id, a failed branch node
    (edges name its cases) or anything else leaves nothing to check.
    """
    trimmed = copy.deepcopy(document)
    for error in exc.errors():
        if not _set_aside(trimmed, [p for p in error["loc"] if not _skip_loc_part(p)], error):
            return None
    try:
        return model.model_validate_json(json.dumps(trimmed), strict=True)
    except pydantic.ValidationError:
        return None


def _set_aside(document: dict[str, Any], loc: list[int | str], error: Any) -> bool:
    """Remove what one error is about from ``document``; False when that cannot be done."""
    if error["type"] == "extra_forbidden":
        parent: Any = document
        for part in loc[:-1]:
            # pydantic's location may name what the document does not hold as such (a tagged
            # union's member, an alias): then this error cannot be set aside
            held = dict(enumerate(parent)) if isinstance(parent, list) else parent
            if not isinstance(held, dict):
                return False
            if part not in held:
                return False
            parent = held[part]
        if isinstance(parent, dict):
            parent.pop(loc[-1], None)
        return True
    spec = document.get("spec")
    if document.get("kind") != "Flow" or not isinstance(spec, dict) or len(loc) < 2:
        return False
    if loc[0] != "spec" or loc[1] == "edges":
        return False
    if loc[1] != "nodes":
        spec.pop(str(loc[1]), None)
        return True
    if len(loc) < 3 or not isinstance(loc[2], int) or loc[2:4] == [loc[2], "id"]:
        return False
    node = spec["nodes"][loc[2]]
    node_id = node.get("id") if isinstance(node, dict) else None
    if not isinstance(node_id, str) or "branch" in node:
        return False
    if not re.fullmatch(common.ID_PATTERN, node_id) or len(node_id) > 63:
        return False
    spec["nodes"][loc[2]] = {"id": node_id, "transform": "."}
    return True


def _label(source: str, index: int, document: Any) -> str:
    """``FILE#DOC (Kind name)``, with as much of it as the document says."""
    if not source:
        return ""
    label = f"{source}#{index}"
    if not isinstance(document, dict):
        return label
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    kind = document.get("kind")
    said = [_printable(part[:80]) for part in (kind, name) if isinstance(part, str) and part]
    return f"{label} ({' '.join(said)})" if said else label


def _printable(text: str) -> str:
    """``text`` with control characters escaped (a newline as backslash-n): one line a label."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _foreign(document: Any) -> bool:
    """True for a Kubernetes object of another API group (a ServiceAccount, a Kustomization)."""
    if not isinstance(document, dict):
        return False
    kind = document.get("kind")
    if isinstance(kind, str) and kind in _KINDS:
        return False
    api_version = document.get("apiVersion")
    return isinstance(api_version, str) and not api_version.startswith(f"{api_group.GROUP}/")


def load_text(text: str, source: str = "") -> LoadResult:
    """Load every document in a YAML stream."""
    result = LoadResult(sources=[source])
    if len(text.encode(errors="replace")) > MAX_DOCUMENT_BYTES:
        result.problems.append(
            Problem("", f"file is larger than {MAX_DOCUMENT_BYTES} bytes", source)
        )
        return result
    try:
        documents = kubeyaml.load_all(text)
    except kubeyaml.YamlError as exc:
        where = f"{source}#{exc.document}" if exc.document else source
        result.problems.append(Problem(exc.path, str(exc), where))
        return result
    for document in documents:
        label = _label(source, document.index, document.value)
        if _foreign(document.value):
            result.skipped.append(f"{label}: not an {api_group.GROUP} resource")
            continue
        resource, problems = parse_resource(document.value, label)
        nonfinite = {error.path: error for error in document.nonfinite}
        problems = [p for p in problems if p.path not in nonfinite]
        problems += [Problem(e.path, str(e), label) for e in nonfinite.values()]
        result.problems.extend(problems)
        if resource is not None:
            result.add(resource, label)
    return result


def _duplicates(loaded: LoadResult) -> list[Problem]:
    """A second resource of the same kind, namespace and name (the last would win silently)."""
    first: dict[tuple[str, str, str], str] = {}
    problems = []
    for resource in loaded.resources:
        meta = resource.metadata
        if not meta.name:
            continue
        key = (resource.kind, meta.namespace or "", meta.name)
        label = loaded.label_of(resource)
        if key in first:
            problems.append(
                Problem(
                    "metadata.name",
                    f'a second {resource.kind} "{meta.name}" (the first is {first[key]})',
                    label,
                )
            )
        else:
            first[key] = label
    return problems


def load_bytes(data: bytes, source: str = "") -> LoadResult:
    """Load a file's content, which must be UTF-8 text as kubectl requires."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        result = LoadResult(sources=[source])
        result.problems.append(
            Problem(
                "",
                f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column} "
                "(save the file as UTF-8)",
                source,
            )
        )
        return result
    return load_text(text, source)


def _is_kustomization(path: Path) -> bool:
    return path.name in ("kustomization.yaml", "kustomization.yml", "Kustomization")


def _files(path: Path, skipped: list[str], exclude: Collection[Path] = ()) -> list[Path]:
    """The YAML files a path names: itself, or a directory's, sub-directories included."""
    if not path.is_dir():
        return [path]
    found = sorted(
        p
        for p in path.rglob("*")
        if p.suffix in (".yaml", ".yml") and p.is_file() and p not in exclude
    )
    for file in found:
        if _is_kustomization(file):
            skipped.append(f"{file}: a kustomization, not a resource")
    return [file for file in found if not _is_kustomization(file)]


def load_paths(paths: Iterable[Path], exclude: Collection[Path] = ()) -> LoadResult:
    """Load every document in the given files (directories: their YAML files, recursively).

    Files of a directory listed in ``exclude`` are left out (the caller reads them otherwise).
    Also reports a resource defined twice across the files.
    """
    result = LoadResult()
    for path in paths:
        for file in _files(path, result.skipped, exclude):
            try:
                data = file.read_bytes()
            except OSError as exc:
                result.problems.append(Problem("", f"cannot read: {exc.strerror}", str(file)))
                continue
            result.extend(load_bytes(data, str(file)))
    result.problems.extend(_duplicates(result))
    return result
