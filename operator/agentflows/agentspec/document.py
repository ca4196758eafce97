"""Read an Agent Spec document: version check, bounds, and ``$component_ref`` resolution.

Text is read by :mod:`agentflows.api.kubeyaml` (JSON is YAML), which bounds the size, the
expansion of aliases and the nesting. On top of that this module bounds what references can
do: every ``{"$component_ref": id}`` is replaced by the component defined under
``$referenced_components`` (at any level; one id space for the whole document), and

- a reference to an id defined nowhere, a reference cycle, a chain of references deeper than
  :data:`MAX_REFERENCE_DEPTH`, or more than :data:`MAX_COMPONENTS` components once references
  are expanded, is refused;
- two components written inline with the same ``id``, and an inline component that repeats the
  id of a referenced one, are refused: identity, not name, matters, so a component used twice
  is defined once and referred to;
- a component type outside Agent Spec is refused, and so is one this runtime does not support
  yet (:data:`UNSUPPORTED`), each with its own message;
- every input and output property needs a ``title`` that is not empty and holds no space,
  quote, brace, comma or period (as the specification requires).

A referenced component is resolved once and the same dict object is used at every place that
refers to it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentflows.agentspec import errors
from agentflows.api import documents, kubeyaml

#: Every released ``agentspec_version`` this runtime reads.
SUPPORTED_VERSIONS = ("25.4.0", "25.4.1", "25.4.2", "26.1.0", "26.1.2", "26.2.0")
#: The version written by the exporter.
EXPORT_VERSION = "26.2.0"
MAX_COMPONENTS = 2000
MAX_REFERENCE_DEPTH = 32
VERSION_FIELD = "agentspec_version"
_LEGACY_VERSION_FIELD = "air_version"
REFS = "$referenced_components"
REF = "$component_ref"

#: Component types this runtime translates (see docs/agentspec.md).
SUPPORTED = frozenset(
    {
        "Flow", "Agent", "SpecializedAgent", "AgentSpecializationParameters", "ManagerWorkers",
        "Swarm", "A2AAgent",
        "ControlFlowEdge", "DataFlowEdge",
        "StartNode", "EndNode", "LlmNode", "AgentNode", "ToolNode", "BranchingNode",
        "FlowNode", "MapNode", "ParallelMapNode", "ParallelFlowNode", "CatchExceptionNode",
        "ApiNode", "InputMessageNode",
        "OutputMessageNode",
        "ServerTool", "ClientTool", "RemoteTool", "MCPTool", "MCPToolBox", "MCPToolSpec",
        "StdioTransport", "StreamableHTTPTransport", "SSETransport",
        "OpenAiConfig", "OpenAiCompatibleConfig", "VllmConfig", "OllamaConfig",
    }
)  # fmt: skip
#: Component types of Agent Spec this runtime refuses, each with the reason shown to the user.
UNSUPPORTED = {
    "RemoteAgent": "RemoteAgent is abstract; use A2AAgent",
    "OciAgent": "OCI agents are not supported; use an Agent, or an A2AAgent for a remote one",
    "BuiltinTool": "builtin tools are not supported; use a ServerTool, a RemoteTool or an MCPTool",
    "OciGenAiConfig": "OCI Generative AI models are not mapped yet; use an "
    "OpenAiCompatibleConfig with an OpenAI-compatible endpoint",
    "GeminiConfig": "Gemini models are not mapped yet; use an OpenAiCompatibleConfig with "
    "Gemini's OpenAI-compatible endpoint",
    "DbmsVectorChainLlmConfig": "DBMS vector-chain models are not supported; use an "
    "OpenAiCompatibleConfig, a VllmConfig or an OllamaConfig",
    "SSEmTLSTransport": "MCP with mTLS is not supported; use an SSETransport",
    "StreamableHTTPmTLSTransport": "MCP with mTLS is not supported; use a StreamableHTTPTransport",
    "MessageSummarizationTransform": "message transforms are not supported; leave the Agent's "
    "transforms empty (agentflows compresses a long conversation itself)",
    "ConversationSummarizationTransform": "message transforms are not supported; leave the "
    "Agent's transforms empty (agentflows compresses a long conversation itself)",
    "InMemoryCollectionDatastore": "datastores are not supported; reach the data through a tool",
    "OracleDatabaseDatastore": "datastores are not supported; reach the data through a tool",
    "PostgresDatabaseDatastore": "datastores are not supported; reach the data through a tool",
}
_TITLE_FORBIDDEN = set(".,{} \n'\"")


def is_agentspec(document: Any) -> bool:
    """True for a decoded document that is Agent Spec rather than a Kubernetes resource."""
    return isinstance(document, dict) and (
        VERSION_FIELD in document
        or _LEGACY_VERSION_FIELD in document
        or "component_type" in document
    )


def read_text(text: str) -> Any:
    """Decode one JSON or YAML document; raise SpecInvalid when it cannot be read."""
    if len(text.encode(errors="replace")) > documents.MAX_DOCUMENT_BYTES:
        raise errors.SpecInvalid(
            [errors.problem("", f"larger than {documents.MAX_DOCUMENT_BYTES} bytes")]
        )
    try:
        loaded = kubeyaml.load_all(text)
    except kubeyaml.YamlError as exc:
        raise errors.SpecInvalid([errors.problem(exc.path, str(exc))]) from None
    if len(loaded) != 1:
        raise errors.SpecInvalid(
            [errors.problem("", f"an Agent Spec file holds one document (found {len(loaded)})")]
        )
    return loaded[0].value


def check_version(document: dict[str, Any]) -> str:
    """The document's ``agentspec_version``; SpecInvalid when missing or not supported."""
    field = VERSION_FIELD if VERSION_FIELD in document else _LEGACY_VERSION_FIELD
    version = document.get(field)
    if version is None:
        message = f"missing; set it to one of {', '.join(SUPPORTED_VERSIONS)}"
    elif version not in SUPPORTED_VERSIONS:
        message = (
            f"version {version!r} is not supported; agentflows reads "
            f"{', '.join(SUPPORTED_VERSIONS)}"
        )
    else:
        return str(version)
    raise errors.SpecInvalid([errors.problem(VERSION_FIELD, message)])


@dataclasses.dataclass
class _Resolver:
    definitions: dict[str, tuple[str, Any]]
    problems: list[Any] = dataclasses.field(default_factory=list)
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    inline_ids: dict[str, str] = dataclasses.field(default_factory=dict)
    stack: list[str] = dataclasses.field(default_factory=list)
    count: int = 0

    def fail(self, path: str, message: str) -> None:
        self.problems.append(errors.problem(path, message))

    def value(self, value: Any, path: str) -> Any:
        if isinstance(value, list):
            return [self.value(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if not isinstance(value, dict):
            return value
        if REF in value:
            return self.reference(value, path)
        if "component_type" in value:
            return self.component(value, path, referenced=False)
        return {k: self.value(v, _join(path, k)) for k, v in value.items() if k != REFS}

    def reference(self, value: dict[str, Any], path: str) -> Any:
        ref = value[REF]
        if len(value) != 1:
            self.fail(
                path, f"a {REF} stands alone (found also {', '.join(sorted(set(value) - {REF}))})"
            )
        if not isinstance(ref, str) or ref not in self.definitions:
            self.fail(
                _join(path, REF), f"unresolved reference {ref!r}: no {REFS} entry has that id"
            )
            return None
        if ref in self.stack:
            cycle = " -> ".join([*self.stack[self.stack.index(ref) :], ref])
            self.fail(_join(path, REF), f"reference cycle: {cycle}")
            return None
        if len(self.stack) >= MAX_REFERENCE_DEPTH:
            self.fail(_join(path, REF), f"references nest deeper than {MAX_REFERENCE_DEPTH}")
            return None
        if ref not in self.resolved:
            self.stack.append(ref)
            before = self.count
            where, definition = self.definitions[ref]
            self.resolved[ref] = self.component(definition, where, referenced=True, ref=ref)
            self.sizes[ref] = self.count - before
            self.stack.pop()
        else:
            self.count += self.sizes[ref]
        self._bound(path)
        return self.resolved[ref]

    def component(
        self, value: dict[str, Any], path: str, *, referenced: bool, ref: str = ""
    ) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("component_type"), str):
            self.fail(path, "a component is a mapping with a component_type")
            return None
        kind = value["component_type"]
        if kind in UNSUPPORTED:
            self.fail(
                _join(path, "component_type"),
                f"{kind} {_named(value)} is not supported: {UNSUPPORTED[kind]}",
            )
        elif kind not in SUPPORTED:
            self.fail(_join(path, "component_type"), f"unknown component type {kind!r}")
        self._identity(value, path, referenced, ref)
        self.count += 1
        self._bound(path)
        for field in ("inputs", "outputs"):
            _check_titles(value.get(field), _join(path, field), self.problems)
        if self.problems and len(self.problems) > 100:
            raise errors.SpecInvalid(self.problems)
        out = {k: self.value(v, _join(path, k)) for k, v in value.items() if k != REFS}
        if referenced and "id" not in out:
            out["id"] = ref
        return out

    def _identity(self, value: dict[str, Any], path: str, referenced: bool, ref: str) -> None:
        cid = value.get("id")
        if referenced:
            if cid is not None and cid != ref:
                self.fail(_join(path, "id"), f"{cid!r} differs from its {REFS} key {ref!r}")
            return
        if not isinstance(cid, str):
            return
        if cid in self.definitions:
            self.fail(
                _join(path, "id"),
                f"{cid!r} is a referenced component written out again inline; "
                f'refer to it with {{"{REF}": "{cid}"}}',
            )
        elif cid in self.inline_ids:
            self.fail(
                _join(path, "id"),
                f"duplicate id {cid!r} (first at {self.inline_ids[cid] or 'the top'})",
            )
        else:
            self.inline_ids[cid] = path

    def _bound(self, path: str) -> None:
        if self.count > MAX_COMPONENTS:
            self.fail(path, f"more than {MAX_COMPONENTS} components once references are expanded")
            raise errors.SpecInvalid(self.problems)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _named(value: dict[str, Any]) -> str:
    name = value.get("name")
    return f"{str(name)[:80]!r}" if name else "(unnamed)"


def _check_titles(properties: Any, path: str, problems: list[Any]) -> None:
    if properties is None:
        return
    if not isinstance(properties, list):
        problems.append(errors.problem(path, "a list of JSON Schema properties"))
        return
    for i, item in enumerate(properties):
        title = item.get("title") if isinstance(item, dict) else None
        where = f"{path}[{i}].title"
        if not isinstance(title, str) or not title:
            problems.append(errors.problem(where, "required: a non-empty property name"))
        elif _TITLE_FORBIDDEN & set(title):
            problems.append(
                errors.problem(
                    where,
                    f"{title[:80]!r}: a title holds no space, quote, brace, comma or period",
                )
            )


def _definitions(
    value: Any, path: str, out: dict[str, tuple[str, Any]], problems: list[Any]
) -> None:
    """Collect every ``$referenced_components`` entry in the document, wherever it is."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            _definitions(item, f"{path}[{i}]", out, problems)
        return
    if not isinstance(value, dict):
        return
    refs = value.get(REFS)
    if refs is not None and not isinstance(refs, dict):
        problems.append(errors.problem(_join(path, REFS), "a mapping of id -> component"))
    elif isinstance(refs, dict):
        for key, component in refs.items():
            where = f"{_join(path, REFS)}.{key}"
            if key in out:
                problems.append(
                    errors.problem(where, f"duplicate id {key!r} (first at {out[key][0]})")
                )
            else:
                out[key] = (where, component)
    for key, item in value.items():
        _definitions(item, _join(path, key), out, problems)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A document with its references resolved."""

    root: dict[str, Any]
    version: str
    #: Path under ``$referenced_components`` -> the resolved component, for each one used.
    references: dict[str, dict[str, Any]]


def resolve(document: Any) -> Resolved:
    """The root component with every reference resolved, and its version; or SpecInvalid."""
    if not isinstance(document, dict):
        raise errors.SpecInvalid([errors.problem("", "an Agent Spec document is a mapping")])
    version = check_version(document)
    definitions: dict[str, tuple[str, Any]] = {}
    problems: list[Any] = []
    _definitions(document, "", definitions, problems)
    resolver = _Resolver(definitions, problems)
    root = {k: v for k, v in document.items() if k not in (VERSION_FIELD, _LEGACY_VERSION_FIELD)}
    resolved = resolver.component(root, "", referenced=False)
    if resolver.problems:
        raise errors.SpecInvalid(resolver.problems)
    references = {definitions[ref][0]: value for ref, value in resolver.resolved.items()}
    return Resolved(resolved, version, references)


def load_text(text: str) -> Resolved:
    """Read and resolve an Agent Spec document from text."""
    return resolve(read_text(text))
