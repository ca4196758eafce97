"""Attacks through a Flow author's JSON Schemas (issue 19, items 5 and 7).

A ``pattern`` is matched in linear time wherever a schema meets data, so no pattern stalls a
check (``^(a+)+$`` against 29 characters took 9 s on Python's backtracking ``re``); data nested
deeper than the stack is a mismatch with its field, never a crash (exit 70).

A check that backtracks never ends on these inputs, so each runs in a child process with a
generous guard: the guard only turns a hang into a failure, nothing here measures time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentflows.api import schemas
from agentflows.cli import main as cli

#: Long enough that a backtracking matcher would run for longer than anyone waits.
EVIL = "a" * 5000 + "!"
#: A hang guard, never an expected duration.
GUARD_SECONDS = 120

HEAD = "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: s}\n"


def _check_in_child(schema: Any, value: Any) -> str:
    """``schemas.mismatch(schema, value)`` in a child process, as ``where: message`` or ok."""
    program = (
        "import json, sys\n"
        "from agentflows.api import schemas\n"
        "schema, value = json.loads(sys.stdin.read())\n"
        "found = schemas.mismatch(schema, value)\n"
        "print('ok' if found is None else f'{found.where}: {found.message}')\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", program],
            input=json.dumps([schema, value]),
            capture_output=True,
            text=True,
            timeout=GUARD_SECONDS,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the schema check was still matching after {GUARD_SECONDS} s (backtracking)")
    return done.stdout.strip()


NESTED = "^(a+)+$"
KEYWORDS = {
    "pattern": ({"type": "string", "pattern": NESTED}, EVIL, f"(root): '{EVIL[:8]}"),
    "patternProperties": (
        {"patternProperties": {NESTED: {"type": "integer"}}},
        {EVIL: "x"},
        "ok",
    ),
    "additionalProperties": (
        {"patternProperties": {NESTED: True}, "additionalProperties": False},
        {EVIL: 1},
        "does not match any of the regexes",
    ),
    "unevaluatedProperties": (
        {"patternProperties": {NESTED: True}, "unevaluatedProperties": False},
        {EVIL: 1},
        "Unevaluated properties are not allowed",
    ),
}


@pytest.mark.parametrize("keyword", list(KEYWORDS))
def test_a_nested_quantifier_pattern_is_matched_in_linear_time_by_every_keyword(
    keyword: str,
) -> None:
    schema, value, expected = KEYWORDS[keyword]
    assert expected in _check_in_child(schema, value)


def test_patterns_keep_their_meaning_on_the_linear_time_matcher() -> None:
    schema = {
        "properties": {"id": {"type": "string", "pattern": r"^[a-z]+-\d{2}$"}},
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert schemas.mismatch(schema, {"id": "abc-12", "x-count": 3}) is None
    assert "does not match" in schemas.mismatch(schema, {"id": "ABC-1"}).message  # type: ignore[union-attr]
    found = schemas.mismatch(schema, {"x-count": "three"})
    assert found is not None and found.path == ("x-count",)
    found = schemas.mismatch(schema, {"other": 1})
    assert found is not None and "'other' does not match any of the regexes: '^x-'" in found.message
    unevaluated = {"allOf": [{"patternProperties": {"^a": True}}], "unevaluatedProperties": False}
    assert schemas.mismatch(unevaluated, {"ab": 1}) is None
    assert "'zz'" in schemas.mismatch(unevaluated, {"ab": 1, "zz": 2}).message  # type: ignore[union-attr]


def test_run_input_against_a_redos_pattern_is_refused_with_its_field(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        HEAD
        + 'spec:\n  input: {type: object, properties: {s: {type: string, pattern: "^(a+)+$"}}}\n'
        '  nodes: [{id: a, transform: "=.run.input"}]\n'
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        done = subprocess.run(
            [Path(sys.executable).parent / "agentflows", "run", str(flow), "--state-dir",
             str(tmp_path / "state"), "--input", f"s={EVIL}"],
            capture_output=True, text=True, timeout=GUARD_SECONDS, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"agentflows run was still matching after {GUARD_SECONDS} s (backtracking)")
    assert done.returncode == 2, done.stderr
    assert "error: input.s: 'aaaa" in done.stderr
    assert "does not match '^(a+)+$'" in done.stderr


@pytest.mark.parametrize(
    "pattern", [r"(a)\1", r"^(?=a)a", r"(?<!b)a"], ids=["backreference", "lookahead", "lookbehind"]
)
def test_a_pattern_the_linear_matcher_cannot_run_is_a_validation_error_with_its_path(
    tmp_path: Path, pattern: str
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        HEAD + "spec:\n  input: {type: object, properties: {s: {type: string, pattern: "
        f"{json.dumps(pattern)}}}}}}}\n  nodes: [{{id: a, transform: '=1'}}]\n"
    )
    result = CliRunner().invoke(cli.main, ["validate", str(flow)])
    assert result.exit_code == 2, result.output
    assert "spec.input.properties.s.pattern: not a valid regular expression" in result.output
    assert "backreferences and lookaround are not supported" in result.output


def test_a_schema_that_skipped_validation_with_lookaround_is_a_schema_mismatch() -> None:
    # an MCP server's tool parameters are never validated as a Flow is
    found = schemas.mismatch({"type": "string", "pattern": "(?=x)x"}, "x")
    assert found is not None and found.bad_schema
    assert found.where == "(schema)"
    assert "lookaround are not supported" in found.message


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_300_deep_input_against_a_recursive_ref_is_exit_2_naming_the_input(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        HEAD + 'spec:\n  input: {type: object, properties: {a: {$ref: "#"}}}\n'
        "  nodes: [{id: a, transform: '=1'}]\n"
    )
    result = CliRunner().invoke(
        cli.main,
        ["run", str(flow), "--state-dir", str(tmp_path / "s"), "--input-json",
         json.dumps(_nested(300))],
    )  # fmt: skip
    assert not isinstance(result.exception, RecursionError), result.exception
    assert result.exit_code == 2, result.output
    assert "error: input: nested too deeply to check against the schema" in result.stderr


def test_a_300_deep_decision_against_a_recursive_ref_is_a_mismatch_not_a_crash() -> None:
    found = schemas.mismatch({"properties": {"a": {"$ref": "#"}}}, _nested(300))
    assert found is not None and not found.bad_schema
    assert found.message == schemas.TOO_DEEP
