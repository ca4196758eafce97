"""JSON Schemas written by Flow and Agent authors: checked when a Flow validates, applied safely.

Two functions, used everywhere a user's schema meets data (run input, input nodes, request
decisions in the operator, model outputs, tool arguments):

- :func:`problems` checks a schema when its Flow or Agent is validated: every keyword has the
  shape JSON Schema 2020-12 gives it, ``pattern`` is a regular expression Python can compile,
  and every ``$ref``/``$dynamicRef`` points inside the schema (``#``, ``#/$defs/x``, ``#name``)
  at something that exists, without a loop that never descends into the data (``$ref: "#"``
  at the root would recurse forever). Any other reference (``http://...``, ``file:///...``) is
  refused with its path: a schema never makes the CLI, the runner or the operator fetch
  anything. The check is one pass over the schema (the 2020-12 meta-schema, applied by
  jsonschema, takes 10 s on a 20,000-property schema; this takes milliseconds).
- :func:`validator` builds the jsonschema validator for a schema with a registry that refuses
  every retrieval, so even a schema that skipped validation cannot reach the network or files.

:func:`mismatch` and :func:`mismatches` apply a schema with that validator, except when a plain
schema certainly matches the value (:func:`_plainly_valid`): then jsonschema is not imported.
"""

from __future__ import annotations

import dataclasses
import functools
import urllib.parse
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Any

from agentflows.api import common, patterns

if TYPE_CHECKING:
    import jsonschema
    import referencing

#: Keywords whose value is one schema.
_ONE = frozenset(
    (
        "additionalProperties",
        "propertyNames",
        "items",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
        "additionalItems",
    )
)
#: Keywords whose value is a non-empty list of schemas.
_LISTS = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))
#: Keywords whose value maps names to schemas.
_MAPS = frozenset(("properties", "patternProperties", "dependentSchemas", "$defs", "definitions"))
#: Applicators that apply their schemas to the same value (not to a part of it): a reference
#: loop through only these never ends.
_IN_PLACE = frozenset(("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas"))
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")
_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(v, str) for v in value)
        and len(set(value)) == len(value)
    )


def _type(value: Any) -> bool:
    if isinstance(value, str):
        return value in _TYPES
    return isinstance(value, list) and bool(value) and _names(value) and set(value) <= set(_TYPES)


def _is(kind: type) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, kind) and not (kind is int and type(value) is bool)


_STRING = (_is(str), "a string")
_COUNT = (_count, "a non-negative integer")
_NUMBER = (_number, "a number")
_FLAG = (_is(bool), "true or false")
#: What each keyword with a fixed shape takes (2020-12 validation, core and meta-data words).
_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "type": (_type, f"one of {', '.join(_TYPES)}, or a list of them"),
    "enum": (_is(list), "a list"),
    "multipleOf": (lambda v: _number(v) and v > 0, "a number above 0"),
    **dict.fromkeys(("maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"), _NUMBER),
    **dict.fromkeys(
        (
            "maxLength",
            "minLength",
            "maxItems",
            "minItems",
            "maxContains",
            "minContains",
            "maxProperties",
            "minProperties",
        ),
        _COUNT,
    ),
    "required": (_names, "a list of distinct strings"),
    "dependentRequired": (
        lambda v: isinstance(v, dict) and all(_names(x) for x in v.values()),
        "a mapping of names to lists of distinct strings",
    ),
    **dict.fromkeys(("uniqueItems", "deprecated", "readOnly", "writeOnly"), _FLAG),
    "examples": (_is(list), "a list"),
    "$vocabulary": (_is(dict), "a mapping"),
    **dict.fromkeys(
        (
            "pattern",
            "format",
            "title",
            "description",
            "$comment",
            "contentEncoding",
            "contentMediaType",
            "$anchor",
            "$dynamicAnchor",
            "$id",
            "$schema",
            *_REFS,
        ),
        _STRING,
    ),
}

Problems = list[tuple[str, str]]


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class _Walk:
    """One pass over a schema: shapes, patterns, and where every subschema and reference is."""

    def __init__(self) -> None:
        self.problems: Problems = []
        #: JSON pointer -> display path of every subschema.
        self.paths: dict[str, str] = {}
        self.anchors: dict[str, str] = {}
        #: (pointer of the schema holding it, the reference, display path of the keyword)
        self.refs: list[tuple[str, str, str]] = []
        #: pointer -> pointers of subschemas applied to the same value
        self.in_place: dict[str, list[str]] = {}

    def run(self, root: Any) -> None:
        stack: list[tuple[Any, str, str]] = [(root, "", "")]
        while stack:
            schema, pointer, path = stack.pop()
            if isinstance(schema, bool):
                self.paths[pointer] = path
                continue
            if not isinstance(schema, dict):
                self.problems.append(
                    (path, "not a valid JSON Schema: a schema is a mapping or a boolean")
                )
                continue
            self.paths[pointer] = path
            stack.extend(self.visit(schema, pointer, path))

    def visit(
        self, schema: dict[str, Any], pointer: str, path: str
    ) -> Iterator[tuple[Any, str, str]]:
        for key, value in schema.items():
            where = _join(path, key)
            here = f"{pointer}/{common.pointer_escape(key)}"
            shape = _SHAPES.get(key)
            if shape is not None and not shape[0](value):
                self.problems.append((where, f"not a valid JSON Schema: {key} must be {shape[1]}"))
                continue
            if key in _ONE:
                yield value, here, where
                if key in _IN_PLACE:
                    self.in_place.setdefault(pointer, []).append(here)
            elif key in _LISTS:
                if not isinstance(value, list) or not value:
                    self.problems.append(
                        (
                            where,
                            f"not a valid JSON Schema: {key} must be a non-empty list of schemas",
                        )
                    )
                    continue
                for index, item in enumerate(value):
                    yield item, f"{here}/{index}", _join(where, index)
                    if key in _IN_PLACE:
                        self.in_place.setdefault(pointer, []).append(f"{here}/{index}")
            elif key in _MAPS:
                if not isinstance(value, dict):
                    self.problems.append(
                        (where, f"not a valid JSON Schema: {key} must be a mapping of schemas")
                    )
                    continue
                for name, item in value.items():
                    if key == "patternProperties":
                        self.pattern(name, where)
                    yield item, f"{here}/{common.pointer_escape(name)}", _join(where, name)
                    if key in _IN_PLACE:
                        self.in_place.setdefault(pointer, []).append(
                            f"{here}/{common.pointer_escape(name)}"
                        )
            elif key == "pattern":
                self.pattern(value, where)
            elif key in _REFS:
                self.refs.append((pointer, value, where))
            elif key in ("$anchor", "$dynamicAnchor"):
                self.anchors[value] = pointer
            elif key == "$id" and pointer:
                self.problems.append(
                    (
                        where,
                        "$id is allowed only at the top of a schema (it would change what "
                        "references resolve to); use $defs and #/$defs/... references",
                    )
                )

    def pattern(self, value: str, where: str) -> None:
        problem = patterns.problem(value)
        if problem is not None:
            self.problems.append((where, problem))


def _target(walk: _Walk, ref: str) -> str | None:
    """The pointer a local reference names, or None when it names nothing in the schema."""
    fragment = urllib.parse.unquote(ref[1:])
    if fragment == "" or fragment.startswith("/"):
        parts = [common.pointer_unescape(p) for p in fragment.split("/")[1:]]
        pointer = common.json_pointer(*parts)
        return pointer if pointer in walk.paths else None
    return walk.anchors.get(fragment)


def _loops(walk: _Walk, targets: dict[str, list[str]]) -> set[str]:
    """Pointers of schemas on a reference loop that applies to the same value forever."""
    edges = {p: [*walk.in_place.get(p, []), *targets.get(p, [])] for p in walk.paths}
    state: dict[str, int] = {}
    looping: set[str] = set()
    for start in edges:
        if start in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(edges[start]))]
        state[start] = 1
        while stack:
            node, successors = stack[-1]
            nxt = next(successors, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                looping.update(n for n, _ in stack[[n for n, _ in stack].index(nxt) :])
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, []))))
    return looping


def problems(schema: Any) -> Problems:
    """What is wrong with a user's JSON Schema, as (path inside the schema, message) pairs."""
    walk = _Walk()
    walk.run(schema)
    found = list(walk.problems)
    targets: dict[str, list[str]] = {}
    checked: list[tuple[str, str, str]] = []
    for pointer, ref, where in walk.refs:
        if not ref.startswith("#"):
            found.append(
                (
                    where,
                    f"{ref[:200]!r} is refused: only references inside the schema "
                    "(#, #/$defs/name, #anchor) are resolved; nothing is fetched",
                )
            )
            continue
        target = _target(walk, ref)
        if target is None:
            found.append((where, f"{ref[:200]!r} points at nothing in this schema"))
            continue
        targets.setdefault(pointer, []).append(target)
        checked.append((pointer, ref, where))
    looping = _loops(walk, targets)
    for pointer, ref, where in checked:
        if pointer in looping:
            found.append(
                (
                    where,
                    f"{ref[:200]!r} loops back without descending into the data "
                    "(validating anything would recurse forever)",
                )
            )
    return found


def _refuse(uri: str) -> referencing.Resource[Any]:
    import referencing.exceptions

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


@functools.cache
def _registry() -> referencing.Registry[Any]:
    """A registry that never retrieves: only references inside a schema resolve."""
    import referencing  # jsonschema is imported only where a schema meets data

    return referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


@functools.cache
def _validator_class() -> type[jsonschema.Draft202012Validator]:
    import jsonschema

    extend: Any = jsonschema.validators.extend  # untyped in types-jsonschema
    extended: type[jsonschema.Draft202012Validator] = extend(
        jsonschema.Draft202012Validator, patterns.keywords()
    )
    return extended


def validator(schema: Any) -> jsonschema.Draft202012Validator:
    """The validator of a user's schema (2020-12), the one every schema check uses.

    It never fetches a reference and matches patterns in linear time
    (:mod:`agentflows.api.patterns`).
    """
    return _validator_class()(schema, registry=_registry())


#: Keywords that never make a value invalid: annotations (``format`` among them, since
#: :func:`validator` asserts no format).
_ANNOTATIONS = frozenset(
    (
        "title",
        "description",
        "$comment",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    )
)
#: Which values certainly are of each JSON type for the 2020-12 validator; it also counts an
#: integral float as an "integer", which is left to it.
_PLAIN_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
}


def _proved(schema: Any, value: Any) -> bool:
    """:func:`_plainly_valid`, with a schema or value too deep for it left to jsonschema."""
    try:
        return _plainly_valid(schema, value)
    except RecursionError:
        return False


def _plainly_valid(schema: Any, value: Any) -> bool:
    """True when ``value`` certainly matches ``schema``, decided without jsonschema.

    Most schemas of a Flow's input or an output are plain: ``type``, ``properties``,
    ``required``, ``items``, ``enum`` of strings, lengths, bounds. Importing jsonschema costs
    about 40 ms of CPU, a tenth of what ``agentflows run`` does before its first node (issue
    25, where the Flow's input is checked), so a plain schema that a value satisfies is
    checked here. False means "not proved",
    never "invalid": any other keyword, any shape it does not expect, any doubt (an integral
    float for ``integer``), and any failure leave the answer and its message to jsonschema.
    """
    if schema is True:
        return True
    if type(schema) is not dict:
        return False
    for keyword, expected in schema.items():
        if keyword in _ANNOTATIONS:
            continue
        check = _PLAIN_KEYWORDS.get(keyword)
        if check is None or not check(schema, expected, value):
            return False
    return True


def _plain_type(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    names = expected if type(expected) is list else [expected]
    if not all(type(n) is str and n in _PLAIN_TYPES for n in names):
        return False  # an unknown type is jsonschema's error to raise
    return any(_PLAIN_TYPES[n](value) for n in names)


def _plain_properties(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    if type(expected) is not dict:
        return False
    if type(value) is not dict:
        return True
    return all(_plainly_valid(expected[k], v) for k, v in value.items() if k in expected)


def _plain_additional(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    named = schema.get("properties", {})
    if schema.get("patternProperties") is not None or type(named) is not dict:
        return False  # not plain: the keys it leaves to additionalProperties are not known here
    if type(value) is not dict:
        return type(expected) in (bool, dict)  # the keyword applies to objects only
    return all(_plainly_valid(expected, v) for k, v in value.items() if k not in named)


def _plain_required(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    if not _names(expected):
        return False
    return type(value) is not dict or all(name in value for name in expected)


def _plain_items(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    if "prefixItems" in schema or not (expected is True or type(expected) is dict):
        return False
    return type(value) is not list or all(_plainly_valid(expected, v) for v in value)


def _plain_enum(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    if type(expected) is not list or not all(type(e) is str for e in expected):
        return False
    return type(value) is str and value in expected


def _plain_const(schema: dict[str, Any], expected: Any, value: Any) -> bool:
    return type(expected) is str and type(value) is str and value == expected


def _plain_size(kind: type[Sized], at_least: bool) -> Callable[[dict[str, Any], Any, Any], bool]:
    def check(schema: dict[str, Any], expected: Any, value: Any) -> bool:
        if not _count(expected):
            return False
        if type(value) is not kind:
            return True
        return bool(len(value) >= expected if at_least else len(value) <= expected)

    return check


def _plain_bound(at_least: bool) -> Callable[[dict[str, Any], Any, Any], bool]:
    def check(schema: dict[str, Any], expected: Any, value: Any) -> bool:
        if not _number(expected):
            return False
        if not _number(value):
            return True  # the keyword applies to numbers only (a bool is none)
        return bool(value >= expected if at_least else value <= expected)

    return check


#: The keywords :func:`_plainly_valid` decides, each a check of (schema, keyword value, value).
_PLAIN_KEYWORDS: dict[str, Callable[[dict[str, Any], Any, Any], bool]] = {
    "type": _plain_type,
    "properties": _plain_properties,
    "additionalProperties": _plain_additional,
    "required": _plain_required,
    "items": _plain_items,
    "enum": _plain_enum,
    "const": _plain_const,
    "minLength": _plain_size(str, True),
    "maxLength": _plain_size(str, False),
    "minItems": _plain_size(list, True),
    "maxItems": _plain_size(list, False),
    "minProperties": _plain_size(dict, True),
    "maxProperties": _plain_size(dict, False),
    "minimum": _plain_bound(True),
    "maximum": _plain_bound(False),
}


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Why a value does not match a schema: the best error's path in the value and message."""

    path: tuple[str | int, ...]
    message: str
    #: True when the schema itself cannot be applied (invalid, or an unresolvable reference).
    bad_schema: bool = False

    @property
    def where(self) -> str:
        """The path joined with ``/``; ``(root)`` for the value itself, ``(schema)``."""
        if self.bad_schema:
            return "(schema)"
        return "/".join(str(part) for part in self.path) or "(root)"


#: What a check says when the value (or the schema) nests deeper than Python's stack allows.
TOO_DEEP = "nested too deeply to check against the schema"


def _applying(schema: Any, check: Callable[[Any], list[Mismatch]]) -> list[Mismatch]:
    """``check(validator)``, with a schema that cannot be applied as one bad-schema Mismatch.

    A value nested deeper than the stack (a 300-deep input against ``$ref: "#"``) is a
    mismatch of the value, not a crash: jsonschema recurses once per level of the data.
    """
    import jsonschema
    import referencing.exceptions

    try:
        return check(validator(schema))
    except RecursionError:
        return [Mismatch((), TOO_DEEP)]
    except (
        jsonschema.SchemaError,
        jsonschema.exceptions.UnknownType,
        referencing.exceptions.Unresolvable,
        patterns.PatternError,
    ) as exc:
        text = getattr(exc, "message", None) or str(exc).splitlines()[0]
        return [Mismatch((), text[:512], bad_schema=True)]


def mismatch(schema: Any, value: Any) -> Mismatch | None:
    """Why ``value`` does not match ``schema`` (the best error), or None when it matches.

    A schema that cannot be applied (invalid, or a reference that does not resolve) is
    reported as a mismatch with ``bad_schema`` rather than raised: callers answer bad data and
    bad schemas alike, and an operator never fails a reconcile on a user's schema.
    """
    if _proved(schema, value):
        return None
    import jsonschema

    def best(checker: jsonschema.Draft202012Validator) -> list[Mismatch]:
        error = jsonschema.exceptions.best_match(checker.iter_errors(value))
        return [] if error is None else [Mismatch(tuple(error.absolute_path), error.message)]

    found = _applying(schema, best)
    return found[0] if found else None


def mismatches(schema: Any, value: Any) -> list[Mismatch]:
    """Every reason ``value`` does not match ``schema``, in the order of their paths.

    The same answers as :func:`mismatch` for a schema that cannot be applied or a value too
    deep to check (one Mismatch).
    """
    if _proved(schema, value):
        return []

    def every(checker: jsonschema.Draft202012Validator) -> list[Mismatch]:
        errors = sorted(checker.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
        return [Mismatch(tuple(e.absolute_path), e.message) for e in errors]

    return _applying(schema, every)
