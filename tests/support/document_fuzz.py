"""Hypothesis strategies that produce Flow, Agent and FlowRun documents a user might hand us.

Used by ``tests/unit/test_fuzz_documents.py`` and ``bench/fuzz.py``; :func:`cases` is the
entry point. Three sources, mixed:

- **mutations of real documents**: the examples, ``config/samples`` and the reproducers copied
  into ``tests/data/fuzz`` (from the newcomer and fuzz reports of issue 10), changed in their
  structure (a value of the wrong type, a huge number, a bad name or jq program, a hostile
  JSON Schema, a key removed or added) and in their text (YAML tags, invalid dates, deep
  nesting, alias bombs, duplicate keys, tabs, truncation, Latin-1, random bytes);
- **generated Flows** with their Agents and FlowRuns, whose nodes reference each other, so
  many of them validate and go on to ``run --dry-run`` (branches, maps, approvals, sub-flows);
- **random bytes**.

Every strategy draws small choices (indices, short values) and builds the text from them, so
hypothesis can generate thousands of cases quickly and shrink each to a small one.
"""

from __future__ import annotations

import collections
import copy
import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.support import fuzz_harness

REPO = Path(__file__).resolve().parents[2]
#: Seeds larger than this are used as they are, never re-serialized (keeps cases fast).
_MAX_STRUCTURED_SEED = 64 * 1024
#: Paths collected from a document before one is chosen to mutate (alias bombs share nodes).
_MAX_PATHS = 2000


def _seed_groups() -> list[tuple[tuple[str, bytes], ...]]:
    """Each seed: the files a user would pass together (an example directory is one seed)."""
    groups: list[tuple[tuple[str, bytes], ...]] = []
    for directory in sorted(p for p in (REPO / "examples").iterdir() if p.is_dir()):
        files = sorted(directory.rglob("*.yaml"))
        groups.append(tuple((f.name, f.read_bytes()) for f in files))
    singles = [
        *sorted((REPO / "examples").glob("*.yaml")),
        *sorted((REPO / "config" / "samples").glob("*.yaml")),
        *sorted((REPO / "tests" / "data" / "fuzz").glob("*.yaml")),
    ]
    groups.extend(((f.name, f.read_bytes()),) for f in singles)
    return groups


SEEDS = _seed_groups()

# Values a user (or an attacker) puts where another type is expected.
HUGE_NUMBERS = [
    0, -1, 1, 2**31, 2**63, 2**64 + 1, 2**128 + 1, 10**68, 0.5, 10.0, 1e68, -0.0, 1e-300,
    float("inf"), float("-inf"), float("nan"),
]  # fmt: skip
BAD_NAMES = [
    "../../escaped", "/etc/passwd", "Bad Name!", "Grüße Flow!", "x" * 300, "", "-a-", "a..b",
    "UPPER", ".", "a/b", "con", "a" * 63, "a" * 64, "\u200bzw", "name\nnewline", "nul\x00",
]  # fmt: skip
JQ_PROGRAMS = [
    "=.", "=.run.input", "=1", "=[range(5)]", "=.nodes", "=.item", '="\\(.run.input)"',
    "=.a | | b", "=if .x then", "={unclosed: .x", "=.nodes.a.json[", "=def f: f; f",
    "=[range(1e9)] | length", "=[limit(200000; repeat(1))] | length", '=error("boom")',
    '="abc" | tonumber', "=input", "=$__loc__", "=env", "=now", "=.[]", "=recurse",
    "=[range(0; 3000)]", "{{ .run.input. }}", "text {{ .run.input }} more", "{{ unclosed",
    "={{ .x }}", "=" + "(" * 400 + "1" + ")" * 400, "=" + ".a" * 2000, "=@base64d", "",
]  # fmt: skip
SCHEMAS: list[Any] = [
    {"$ref": "#/nope"}, {"$ref": "#"}, {"$ref": "file:///etc/hostname"},
    {"type": "nonsense"}, {"type": "string", "pattern": "a{99999999999}"},
    {"type": "string", "pattern": "["}, {"type": "string", "pattern": "(a+)+$"},
    {"properties": 5}, {"type": "object", "required": "name"}, {"enum": []},
    {"type": "array", "items": {"$ref": "#"}}, {"type": "object", "properties": {"a": {"$ref": "#"}}},
    {"anyOf": []}, {"format": "date-time", "type": "string"}, {"minimum": "x"},
    {"type": "integer", "multipleOf": 0}, {"type": "object", "additionalProperties": False,
                                            "required": ["zz"]},
]  # fmt: skip
UNKNOWN_KEYS = ["transfrom", "on", "true", "", "ñ", "\u200b", "extra", "0", "spec", "$ref"]


@functools.cache
def _schemas() -> st.SearchStrategy[Any]:
    """A hostile JSON Schema, copied: mutations must never change the shared list."""
    return st.sampled_from(SCHEMAS).map(copy.deepcopy)


@functools.cache
def _unicode_text() -> st.SearchStrategy[str]:
    """Any code point, surrogates and control characters included."""
    return st.text(
        st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=12
    )


@functools.cache
def json_values() -> st.SearchStrategy[Any]:
    """Small JSON-like values of every type, nested a little."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(HUGE_NUMBERS),
        st.integers(-5, 5),
        _unicode_text(),
        st.sampled_from(BAD_NAMES),
        st.sampled_from(JQ_PROGRAMS),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from(UNKNOWN_KEYS), inner, max_size=3),
        ),
        max_leaves=6,
    )


@functools.cache
def evil_values() -> st.SearchStrategy[Any]:
    """A value to put anywhere in a document: wrong types, huge numbers, bad names, bad jq."""
    return st.one_of(
        json_values(),
        _schemas(),
        st.sampled_from(HUGE_NUMBERS),
        st.sampled_from(BAD_NAMES),
        st.sampled_from(JQ_PROGRAMS),
    )


# ---- structural mutation -------------------------------------------------------------------


def _paths(document: Any) -> list[list[Any]]:
    """Paths of the nodes of a decoded document, breadth first, at most _MAX_PATHS."""
    paths: list[list[Any]] = []
    queue: collections.deque[tuple[list[Any], Any]] = collections.deque([([], document)])
    while queue and len(paths) < _MAX_PATHS:
        path, value = queue.popleft()
        paths.append(path)
        if isinstance(value, dict):
            queue.extend(([*path, k], v) for k, v in value.items())
        elif isinstance(value, list):
            queue.extend(([*path, i], v) for i, v in enumerate(value))
    return paths


def _parent(document: Any, path: list[Any]) -> Any:
    for part in path[:-1]:
        document = document[part]
    return document


@st.composite
def mutated_document(draw: st.DrawFn, document: Any) -> Any:
    """The decoded document with a few structural mutations applied."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        operation = draw(st.sampled_from(["set", "set", "set", "delete", "add", "copy", "dup"]))
        if not path:
            if operation == "set":
                document = draw(evil_values())
            continue
        parent, last = _parent(document, path), path[-1]
        if operation == "set":
            parent[last] = draw(evil_values())
        elif operation == "delete":
            del parent[last]
        elif operation == "add" and isinstance(parent[last], dict):
            parent[last][draw(st.sampled_from(UNKNOWN_KEYS))] = draw(evil_values())
        elif operation == "copy":
            source = _parent(document, [*draw(st.sampled_from(paths)), None])
            parent[last] = copy.deepcopy(source)
        elif operation == "dup" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
    return document


def _decoded(content: bytes) -> list[Any] | None:
    if len(content) > _MAX_STRUCTURED_SEED or b"&" in content:
        return None  # large seeds and anchors: mutate their text only
    try:
        return [d for d in yaml.safe_load_all(content.decode("utf-8")) if d is not None]
    except Exception:  # PyYAML raises ValueError and more on the seeds that reproduce its bugs
        return None


_DECODED = {content: _decoded(content) for group in SEEDS for _, content in group}


#: libyaml's emitter when PyYAML was built with it (generation is several times faster).
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_documents(documents: list[Any], ascii_only: bool) -> str:
    """YAML for decoded documents; with ascii_only, non-ASCII (surrogates too) as escapes."""
    try:
        return yaml.dump_all(
            documents, Dumper=_DUMPER, allow_unicode=not ascii_only, sort_keys=False
        )
    except (yaml.YAMLError, RecursionError, ValueError):
        return json.dumps(documents[0] if documents else None)


@st.composite
def structurally_mutated(draw: st.DrawFn, content: bytes) -> bytes:
    """A seed file with its decoded documents mutated and written back as YAML."""
    decoded = _DECODED.get(content)
    if not decoded:
        return content
    documents = [draw(mutated_document(d)) for d in decoded]
    ascii_only = draw(st.booleans())
    text = dump_documents(documents, ascii_only)
    return text.encode("utf-8", "surrogatepass")


# ---- text mutation ---------------------------------------------------------------------------


def _alias_bomb(levels: int, fan: int) -> str:
    """A one-line flow sequence whose last anchor expands to fan**levels strings."""
    parts = ["&a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


SNIPPETS: list[Callable[[int], str]] = [
    lambda n: "2024-02-30",
    lambda n: "!!float x",
    lambda n: "!!bool x",
    lambda n: "!!timestamp x",
    lambda n: "!!int 0x",
    lambda n: "!!binary ~~~",
    lambda n: '!!python/object/apply:os.system ["true"]',
    lambda n: "!!set {a}",
    lambda n: "!!omap [a]",
    lambda n: "&self [*self]",
    lambda n: "*undefined",
    lambda n: "[" * (n * 40) + "]" * (n * 40),
    lambda n: "{a: " * (n * 20) + "1" + "}" * (n * 20),
    lambda n: _alias_bomb(2 + n % 8, 2 + n % 9),
    lambda n: ".inf",
    lambda n: "-.nan",
    lambda n: "1e400",
    lambda n: "0x1F",
    lambda n: "1_000",
    lambda n: "~",
    lambda n: "yes",
    lambda n: "off",
    lambda n: '"\\ud800"',
    lambda n: '"\\x00nul"',
    lambda n: '"\\U0010FFFF\u202e"',
    lambda n: "9" * (n * 10),
    lambda n: "x" * (n * 1000),
    lambda n: '"{{ " * 50',
    lambda n: "|\n  multi\n  line",
    lambda n: "'unterminated",
    lambda n: "@reserved",
    lambda n: "`backtick",
]
_VALUE_LINE = re.compile(r"^(\s*(?:- )?[^\s:#][^:#]*:)\s+(\S.*)$")


def _lines(text: str) -> list[str]:
    return text.split("\n")


@st.composite
def text_mutated(draw: st.DrawFn, text: str) -> bytes:
    """A YAML text with a few line-level or byte-level mutations."""
    for _ in range(draw(st.integers(1, 3))):
        lines = _lines(text)
        index = draw(st.integers(0, max(0, len(lines) - 1)))
        operation = draw(
            st.sampled_from(["snippet", "snippet", "snippet", "dup", "del", "tab", "swap", "key"])
        )
        line = lines[index]
        if operation == "snippet":
            match = _VALUE_LINE.match(line)
            snippet = draw(st.sampled_from(SNIPPETS))(draw(st.integers(1, 60)))
            if match and "\n" not in snippet:
                lines[index] = f"{match.group(1)} {snippet}"
            else:
                indent = line[: len(line) - len(line.lstrip())]
                lines.insert(index, f"{indent}fuzz: {snippet}".replace("\n", "\n" + indent))
        elif operation == "dup":
            lines.insert(index, line)
        elif operation == "del":
            del lines[index]
        elif operation == "tab":
            lines[index] = "\t" + line.lstrip(" ")
        elif operation == "swap" and len(lines) > 1:
            other = draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        elif operation == "key":
            indent = line[: len(line) - len(line.lstrip())]
            lines.insert(index, f"{indent}{draw(st.sampled_from(UNKNOWN_KEYS)) or 'k'}: 1")
        text = "\n".join(lines)
    return text.encode("utf-8", "surrogateescape")


@st.composite
def byte_mutated(draw: st.DrawFn, content: bytes) -> bytes:
    """A file with a byte-level change: encoding, truncation, random bytes, BOM, CRLF."""
    operation = draw(
        st.sampled_from(
            [
                "latin1",
                "truncate",
                "flip",
                "prefix",
                "nul",
                "bom",
                "utf16",
                "crlf",
                "empty",
                "append",
            ]
        )
    )
    if operation == "latin1":
        text = content.decode("utf-8", "replace").replace("name: ", "name: café-", 1)
        return text.encode("latin-1", "replace")
    if operation == "truncate":
        return content[: draw(st.integers(0, len(content)))]
    if operation == "flip" and content:
        at = draw(st.integers(0, len(content) - 1))
        return content[:at] + bytes([content[at] ^ draw(st.integers(1, 255))]) + content[at + 1 :]
    if operation == "prefix":
        return draw(st.binary(max_size=64)) + content
    if operation == "nul":
        return content.replace(b"\n", b"\n\x00", 1)
    if operation == "bom":
        return b"\xef\xbb\xbf" + content
    if operation == "utf16":
        return content.decode("utf-8", "replace").encode("utf-16")
    if operation == "crlf":
        return content.replace(b"\n", b"\r\n")
    if operation == "empty":
        return draw(st.sampled_from([b"", b"\n", b"# only a comment\n", b"---\n---\n", b"null\n"]))
    return content + b"\n---\n" + draw(st.sampled_from(SEEDS))[0][1]


@st.composite
def mutated_file(draw: st.DrawFn, content: bytes) -> bytes:
    """One seed file changed by zero or more structural, text and byte mutations."""
    how = draw(st.sampled_from(["none", "structure", "structure", "text", "text", "both", "bytes"]))
    if how in ("structure", "both"):
        content = draw(structurally_mutated(content))
    if how in ("text", "both"):
        content = draw(text_mutated(content.decode("utf-8", "surrogateescape")))
    if how == "bytes":
        content = draw(byte_mutated(content))
    return content


@st.composite
def mutated_seed(draw: st.DrawFn) -> tuple[tuple[str, bytes], ...]:
    """A seed (one file or an example directory) with one of its files mutated."""
    group = draw(st.sampled_from(SEEDS))
    target = draw(st.integers(0, len(group) - 1))
    return tuple(
        (name, draw(mutated_file(content)) if i == target else content)
        for i, (name, content) in enumerate(group)
    )


# ---- generated documents -----------------------------------------------------------------------

NODE_IDS = ["a", "b", "c", "d", "e"]
FLOW_NAMES = ["main", "sub", "other"]
AGENT_NAMES = ["helper", "reviewer"]


def _maybe_evil(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes a hostile one."""
    return st.one_of(good, good, good, evil_values())


@functools.cache
def _expression() -> st.SearchStrategy[Any]:
    return _maybe_evil(st.sampled_from([*JQ_PROGRAMS[:7], "=.run.input.n // 1", "=[1,2,3]"]))


@functools.cache
def _model() -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {"name": st.sampled_from(["openai/gpt-4o-mini", "gpt-4o", "anthropic/claude", "x"])},
        optional={"temperature": _maybe_evil(st.just(0.2)), "maxTokens": _maybe_evil(st.just(64))},
    )


@functools.cache
def _tool() -> st.SearchStrategy[Any]:
    python = st.fixed_dictionaries({"python": st.just({"script": "print(1)"})})
    http = st.fixed_dictionaries({"http": st.just({"url": "http://127.0.0.1:9/x"})})
    agent = st.fixed_dictionaries(
        {"agent": st.sampled_from(AGENT_NAMES), "name": st.sampled_from(["search", "nope"])}
    )
    return st.one_of(python, http, agent).flatmap(
        lambda body: st.fixed_dictionaries({}, optional={"args": json_values()}).map(
            lambda extra: {**body, **extra}
        )
    )


@functools.cache
def _call(kind: str) -> st.SearchStrategy[Any]:
    if kind == "agent":
        return st.fixed_dictionaries(
            {"name": _maybe_evil(st.sampled_from(AGENT_NAMES)), "prompt": _expression()}
        )
    if kind == "flow":
        return st.fixed_dictionaries(
            {"name": _maybe_evil(st.sampled_from(FLOW_NAMES))}, optional={"input": json_values()}
        )
    return _tool()


@functools.cache
def _node_body(kind: str) -> st.SearchStrategy[Any]:
    ids = st.sampled_from(NODE_IDS)
    bodies: dict[str, st.SearchStrategy[Any]] = {
        "transform": _expression(),
        "agent": _call("agent"),
        "tool": _call("tool"),
        "flow": _call("flow"),
        "llm": st.fixed_dictionaries(
            {"model": _model(), "prompt": _expression()},
            optional={"outputSchema": st.one_of(st.just({"type": "object"}), _schemas())},
        ),
        "branch": st.fixed_dictionaries(
            {
                "value": _expression(),
                "cases": st.dictionaries(st.sampled_from(["1", "true", "x"]), ids),
            },
            optional={"default": ids},
        ),
        "map": st.sampled_from(["agent", "tool", "flow"]).flatmap(
            lambda k: st.fixed_dictionaries(
                {"items": _expression(), k: _call(k)},
                optional={
                    "concurrency": _maybe_evil(st.integers(1, 4)),
                    "maxItems": _maybe_evil(st.integers(1, 50)),
                },
            )
        ),
        "approval": st.fixed_dictionaries(
            {"message": _expression()},
            optional={
                "timeoutSeconds": _maybe_evil(st.integers(1, 60)),
                "onTimeout": st.sampled_from(["reject", "fail", "nope"]),
            },
        ),
        "input": st.fixed_dictionaries(
            {"message": st.just("data?")}, optional={"schema": _schemas()}
        ),
    }
    return bodies[kind]


@st.composite
def _node(draw: st.DrawFn, node_id: str) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            ["transform"] * 4
            + ["agent", "tool", "flow", "llm", "branch", "map", "approval", "input"]
        )
    )
    return {"id": node_id, kind: draw(_node_body(kind))}


@functools.cache
def _flow_fields() -> dict[str, st.SearchStrategy[Any]]:
    """Optional Flow spec fields and what to draw them from."""
    return {
        "input": st.one_of(
            st.just({"type": "object", "properties": {"n": {"type": "integer"}}}),
            _schemas(),
        ),
        "output": _expression(),
        "limits": st.fixed_dictionaries(
            {},
            optional={
                "timeoutSeconds": _maybe_evil(st.integers(1, 30)),
                "maxNodeExecutions": _maybe_evil(st.integers(1, 50)),
                "maxTokens": _maybe_evil(st.integers(1, 10_000)),
                "maxCostUSD": _maybe_evil(st.just(1.5)),
            },
        ),
        "concurrency": st.fixed_dictionaries(
            {"policy": st.sampled_from(["Allow", "Forbid", "Nope"])}
        ),
        "triggers": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["t", "Bad!"])},
                optional={
                    "schedule": st.just({"cron": "* * * * *"}),
                    "kubernetes": st.fixed_dictionaries(
                        {"apiVersion": st.just("v1"), "kind": st.just("Pod")},
                        optional={"filter": _expression()},
                    ),
                    "input": _expression(),
                },
            ),
            max_size=2,
        ),
    }


@st.composite
def generated_flow(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A Flow whose nodes, edges and sub-flows reference each other, sometimes wrongly."""
    count = draw(st.integers(1, len(NODE_IDS)))
    nodes = [draw(_node(i)) for i in NODE_IDS[:count]]
    spec: dict[str, Any] = {"nodes": nodes}
    if draw(st.booleans()):
        pairs = st.tuples(st.sampled_from(NODE_IDS[:count]), st.sampled_from(NODE_IDS[:count]))
        spec["edges"] = [{"from": f, "to": t} for f, t in draw(st.lists(pairs, max_size=4))]
    for key, strategy in _flow_fields().items():
        if draw(st.integers(0, 2)) == 0:
            spec[key] = draw(strategy)
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": spec,
    }


@st.composite
def generated_agent(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """An Agent with a model, maybe tools, sub-agents and sub-flows."""
    spec: dict[str, Any] = {
        "model": draw(_model()),
        "systemPrompt": draw(_maybe_evil(st.just("Be brief."))),
    }
    if draw(st.booleans()):
        spec["tools"] = [{"name": "search", **draw(st.one_of(
            st.just({"python": {"script": "print(1)"}}),
            st.just({"mcp": {"url": "http://127.0.0.1:9/mcp"}}),
            st.just({"http": {"url": "http://127.0.0.1:9/x"}}),
        ))}]  # fmt: skip
    if draw(st.booleans()):
        spec["subAgents"] = draw(st.lists(st.sampled_from(AGENT_NAMES), max_size=2))
    if draw(st.booleans()):
        spec["subFlows"] = draw(st.lists(st.sampled_from(FLOW_NAMES), max_size=2))
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": spec,
    }


@st.composite
def generated_documents(draw: st.DrawFn) -> tuple[tuple[str, bytes], ...]:
    """A Flow with the Agents, sub-Flows and FlowRuns it names, in one or two files."""
    documents: list[Any] = [draw(generated_flow("main"))]
    documents += [
        draw(generated_flow(n))
        for n in draw(st.lists(st.sampled_from(FLOW_NAMES[1:]), max_size=2, unique=True))
    ]
    documents += [
        draw(generated_agent(n))
        for n in draw(st.lists(st.sampled_from(AGENT_NAMES), max_size=2, unique=True))
    ]
    if draw(st.integers(0, 4)) == 4:
        documents.append(
            {"apiVersion": "agentflows.io/v1alpha1", "kind": "FlowRun", "metadata": {"name": "run-1"},
             "spec": {"flow": draw(st.sampled_from(FLOW_NAMES)), "input": draw(json_values())}}
        )  # fmt: skip
    documents = [
        draw(mutated_document(d)) if draw(st.integers(0, 3)) == 0 else d for d in documents
    ]
    ascii_only = draw(st.booleans())
    if len(documents) > 1 and draw(st.booleans()):
        split = draw(st.integers(1, len(documents) - 1))
        halves = [documents[:split], documents[split:]]
        return tuple(
            (f"part{i}.yaml", dump_documents(h, ascii_only).encode("utf-8", "surrogatepass"))
            for i, h in enumerate(halves)
        )
    return (("flow.yaml", dump_documents(documents, ascii_only).encode("utf-8", "surrogatepass")),)


# ---- cases -------------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> fuzz_harness.Case:
    """A fuzz case: mutated seeds, generated documents or random bytes, and the run's options."""
    files = draw(
        st.one_of(
            mutated_seed(),
            mutated_seed(),
            mutated_seed(),
            mutated_seed(),
            generated_documents(),
            generated_documents(),
            generated_documents(),
            st.binary(max_size=512).map(lambda b: (("random.yaml", b),)),
        )
    )
    run_name = None
    if draw(st.integers(0, 9)) == 9:
        run_name = draw(st.sampled_from([*BAD_NAMES, "{WS}/absolute", "ok-name"]))
    return fuzz_harness.Case(
        files=files, run_name=run_name, state_dir_is_a_file=draw(st.integers(0, 29)) == 29
    )
