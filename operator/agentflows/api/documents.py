"""Load Agent, Flow and FlowRun documents from YAML, turning every error into a Problem.

A Problem names where it is (file, document, and a dotted path such as
``spec.nodes[3].branch.cases.bug``) and what is wrong, in one line. Loading never stops at the
first problem: a user fixing a file sees them all at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pydantic
import yaml

from agentflows.api import agent, flow, flowrun

MAX_DOCUMENT_BYTES = 4 * 1024 * 1024


def _key_text(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    return str(key)


class _KubectlLoader(yaml.SafeLoader):
    """SafeLoader whose mapping keys are strings, converted as kubectl's YAML reader does.

    Converting while constructing matters: ``{1: a, yes: b}`` would otherwise collapse into one
    key, because ``True == 1`` in Python.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _key_text(self.construct_object(key_node, deep=True))
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


def _construct_map(loader: _KubectlLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    return loader.construct_mapping(node, deep=True)


_KubectlLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def safe_load_all(text: str) -> list[Any]:
    """Parse a YAML stream as kubectl does, dropping empty documents.

    Like kubectl (YAML 1.1), an unquoted ``yes``, ``on`` or ``y`` is true; a key that becomes
    a boolean or a number is turned into its string, so ``cases: {true: x}`` works and a file
    means the same locally as it does in a cluster.
    """
    return [d for d in yaml.load_all(text, Loader=_KubectlLoader) if d is not None]


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
        return f"{where}{self.path}: {self.message}" if self.path else f"{where}{self.message}"


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
        problems.append(Problem(path, message))
    return problems


@dataclasses.dataclass
class LoadResult:
    """What a set of documents held: the resources that parsed, and every problem."""

    resources: list[Resource] = dataclasses.field(default_factory=list)
    problems: list[Problem] = dataclasses.field(default_factory=list)

    def of_kind(self, kind: type[Any]) -> list[Any]:
        """The resources of one model class."""
        return [r for r in self.resources if isinstance(r, kind)]


def parse_resource(document: Any, source: str = "") -> tuple[Resource | None, list[Problem]]:
    """Validate one decoded document against the model its ``kind`` names."""
    if not isinstance(document, dict):
        return None, [Problem("", "a document must be a mapping with apiVersion and kind", source)]
    kind = document.get("kind")
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None, [
            Problem("kind", f"unknown kind {kind!r}; expected one of Agent, Flow, FlowRun", source)
        ]
    api_version = document.get("apiVersion")
    if api_version != "agentflows.io/v1alpha1":
        return None, [
            Problem("apiVersion", f"{api_version!r} is not agentflows.io/v1alpha1", source)
        ]
    try:
        return model.model_validate(document), []
    except pydantic.ValidationError as exc:
        problems = [dataclasses.replace(p, source=source) for p in validation_problems(exc)]
        return _without_unknown_fields(model, document, exc), problems


def _without_unknown_fields(
    model: type[agent.Agent] | type[flow.Flow] | type[flowrun.FlowRun],
    document: dict[str, Any],
    exc: pydantic.ValidationError,
) -> Resource | None:
    """The resource with its unknown fields dropped, when those were its only problems.

    The unknown fields are still reported (and nothing runs), but the rest of the document is
    checked too, so one misspelled key does not hide every graph problem behind it.
    """
    errors = exc.errors()
    if any(error["type"] != "extra_forbidden" for error in errors):
        return None
    import copy

    trimmed = copy.deepcopy(document)
    for error in errors:
        parent: Any = trimmed
        *path, last = error["loc"]
        for part in path:
            parent = parent[part]
        if isinstance(parent, dict):
            parent.pop(last, None)
    try:
        return model.model_validate(trimmed)
    except pydantic.ValidationError:
        return None


def load_text(text: str, source: str = "") -> LoadResult:
    """Load every document in a YAML stream."""
    result = LoadResult()
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        result.problems.append(
            Problem("", f"file is larger than {MAX_DOCUMENT_BYTES} bytes", source)
        )
        return result
    try:
        documents = safe_load_all(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        result.problems.append(Problem("", f"malformed YAML: {where}{problem}", source))
        return result
    for index, document in enumerate(documents):
        name = document.get("metadata", {}).get("name") if isinstance(document, dict) else None
        label = f"{source}#{index + 1}" + (f" ({name})" if name else "") if source else ""
        resource, problems = parse_resource(document, label)
        result.problems.extend(problems)
        if resource is not None:
            result.resources.append(resource)
    return result


def load_paths(paths: Iterable[Path]) -> LoadResult:
    """Load every document in the given files (directories: their *.yaml and *.yml files)."""
    result = LoadResult()
    for path in paths:
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
        for file in files:
            try:
                text = file.read_text()
            except OSError as exc:
                result.problems.append(Problem("", f"cannot read: {exc.strerror}", str(file)))
                continue
            loaded = load_text(text, str(file))
            result.resources.extend(loaded.resources)
            result.problems.extend(loaded.problems)
    return result
