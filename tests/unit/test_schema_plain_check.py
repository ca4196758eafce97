"""A plain schema that a value matches is decided without jsonschema, with jsonschema's answer.

:func:`agentflows.api.schemas.mismatches` and :func:`~agentflows.api.schemas.mismatch` prove a
value valid against a plain schema (``type``, ``properties``, ``required``, ...) themselves, so
``agentflows run`` checks a Flow's input before its first node without importing jsonschema
(issue 25). Whatever they cannot prove goes to jsonschema. Here, generated schemas and values
are answered both ways and must agree, on exactly the cases where one could slip: integral
floats, booleans among numbers, unknown types, keys left to ``additionalProperties``.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentflows.api import schemas

TYPES = ["string", "boolean", "null", "object", "array", "integer", "number", "colour"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, 2.5, -1.0]),
    st.sampled_from(["", "a", "ab", "é", "abc"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    ),
    max_leaves=8,
)


def _keywords(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    counts = st.one_of(st.integers(0, 3), st.sampled_from([-1, 1.5, True]))
    one_keyword = st.one_of(
        st.tuples(st.just("type"), st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), max_size=3))),
        st.tuples(st.just("properties"), st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2)),
        st.tuples(st.just("additionalProperties"), inner),
        st.tuples(st.just("patternProperties"), st.just({"^c": {"type": "string"}})),
        st.tuples(st.just("required"), st.lists(st.sampled_from(["a", "b", "c"]), max_size=2)),
        st.tuples(st.just("items"), inner),
        st.tuples(st.just("prefixItems"), st.just([{"type": "integer"}])),
        st.tuples(st.just("enum"), st.lists(st.one_of(st.sampled_from(["a", "ab"]), scalars), max_size=3)),
        st.tuples(st.just("const"), scalars),
        st.tuples(st.sampled_from(["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"]), counts),
        st.tuples(st.sampled_from(["minimum", "maximum"]), st.one_of(st.integers(-2, 2), st.just(0.5), st.just(True))),
        st.tuples(st.sampled_from(["title", "description", "format", "default"]), st.just("email")),
        st.tuples(st.sampled_from(["pattern", "anyOf", "not", "$ref"]), st.just({"type": "string"})),
    )  # fmt: skip
    return st.lists(one_keyword, max_size=4).map(dict)


plain_schemas = st.recursive(
    st.one_of(st.booleans(), st.just({})), lambda inner: _keywords(inner), max_leaves=6
)


def jsonschema_answers(schema: Any, value: Any) -> list[tuple[tuple[Any, ...], str]] | str:
    """What jsonschema itself says: the sorted errors, or the exception an unusable schema raises."""
    try:
        errors = sorted(
            schemas.validator(schema).iter_errors(value),
            key=lambda e: [str(p) for p in e.absolute_path],
        )
    except Exception as exc:  # an unusable schema: the two sides must agree
        return type(exc).__name__
    return [(tuple(e.absolute_path), e.message) for e in errors]


def our_answers(schema: Any, value: Any) -> list[tuple[tuple[Any, ...], str]] | str:
    try:
        found = schemas.mismatches(schema, value)
    except Exception as exc:
        return type(exc).__name__
    if any(m.bad_schema for m in found):
        return "bad schema"
    return [(m.path, m.message) for m in found]


@settings(
    max_examples=1500, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(schema=plain_schemas, value=values)
def test_every_answer_is_the_one_jsonschema_gives(schema: Any, value: Any) -> None:
    expected = jsonschema_answers(schema, value)
    ours = our_answers(schema, value)
    if ours == "bad schema":
        assert isinstance(expected, str)  # jsonschema refused the schema too
    else:
        assert ours == expected
    if not isinstance(expected, str):
        assert (schemas.mismatch(schema, value) is None) == (expected == [])


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "integer"}, 1.0),  # an integer for jsonschema; not proved here, still valid
        ({"type": "number"}, True),
        ({"type": ["string", "colour"]}, "a"),  # jsonschema's UnknownType
        ({"properties": {"a": {"type": "string"}}, "additionalProperties": False}, {"b": 1}),
        ({"enum": [1]}, True),
        ({"minimum": 1}, True),
    ],
)
def test_the_cases_a_plain_check_could_get_wrong_get_jsonschema_s_answer(
    schema: dict[str, Any], value: Any
) -> None:
    ours = our_answers(schema, value)
    expected = jsonschema_answers(schema, value)
    assert ours == expected or (ours == "bad schema" and isinstance(expected, str))


def test_a_value_matching_a_plain_schema_is_checked_without_importing_jsonschema() -> None:
    code = (
        "import sys\n"
        "from agentflows.api import schemas\n"
        "schema = {'type': 'object', 'properties': {'name': {'type': 'string'},"
        " 'tags': {'type': 'array', 'items': {'enum': ['a', 'b']}}}, 'required': ['name'],"
        " 'additionalProperties': False}\n"
        "assert schemas.mismatches(schema, {'name': 'Ada', 'tags': ['a']}) == []\n"
        "print('jsonschema' in sys.modules)\n"
        "assert schemas.mismatches(schema, {'tags': ['c']}) != []\n"
        "print('jsonschema' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]  # a mismatch's message is jsonschema's
