"""JSON Schemas never fetch anything: remote and file refs are refused with their path at
validation, and the one validator every schema check uses cannot retrieve. A real listener on
loopback records whether anything reached it.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import referencing.exceptions
from click.testing import CliRunner

from agentflows.api import schemas
from agentflows.cli import main as cli
from tests.support.http_serving import ServedHTTP

HEAD = "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: s}\n"
REFUSED = "is refused: only references inside the schema (#, #/$defs/name, #anchor) are resolved"


class Listener(ServedHTTP):
    """An HTTP server on loopback that records every request path it gets."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                listener.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"type": "string"}')

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)
        self.url = self.origin


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as server:
        yield server


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flow.yaml"
    path.write_text(text)
    return path


def test_remote_refs_in_input_schemas_are_refused_and_nothing_is_fetched(
    tmp_path: Path, listener: Listener
) -> None:
    url = f"{listener.url}/echo"
    path = write(
        tmp_path,
        HEAD + f'spec:\n  input: {{$ref: "{url}?from=flow"}}\n  nodes:\n'
        f'    - id: ask\n      input:\n        message: "data?"\n'
        f'        schema: {{$ref: "{url}?from=node"}}\n',
    )
    code, out, _ = invoke("validate", str(path))
    assert code == 2
    assert out.splitlines() == [
        f"{path}#1 (Flow s): spec.nodes[0].input.schema.$ref: '{url}?from=node' {REFUSED};"
        " nothing is fetched",
        f"{path}#1 (Flow s): spec.input.$ref: '{url}?from=flow' {REFUSED}; nothing is fetched",
    ]
    code, _, _ = invoke("run", str(path), "--state-dir", str(tmp_path / "runs"), "--input", "a=1")
    assert code == 2
    assert listener.paths == []


def test_a_file_ref_is_refused_and_the_file_is_never_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"canary": "do-not-print-me"}')
    path = write(
        tmp_path,
        HEAD
        + f'spec:\n  input: {{$ref: "file://{secret}"}}\n  nodes: [{{id: a, transform: "."}}]\n',
    )
    code, out, err = invoke("validate", str(path))
    assert code == 2
    assert f"spec.input.$ref: 'file://{secret}' {REFUSED}" in out
    assert "do-not-print-me" not in out + err


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("{$ref: '#/nope'}", "spec.input.$ref: '#/nope' points at nothing in this schema"),
        (
            "{$ref: '#'}",
            "spec.input.$ref: '#' loops back without descending into the data"
            " (validating anything would recurse forever)",
        ),
        (
            "{type: string, pattern: 'a{99999999999}'}",
            "spec.input.pattern: not a valid regular expression 'a{99999999999}':"
            " the repetition number is too large",
        ),
    ],
)
def test_schemas_that_crashed_a_run_are_refused_by_validate_and_run(
    tmp_path: Path, schema: str, message: str
) -> None:
    path = write(
        tmp_path, HEAD + f'spec:\n  input: {schema}\n  nodes: [{{id: a, transform: "."}}]\n'
    )
    code, out, _ = invoke("validate", str(path))
    assert (code, out) == (2, f"{path}#1 (Flow s): {message}\n")
    code, out, err = invoke(
        "run", str(path), "--state-dir", str(tmp_path / "runs"), "--input", "x=1"
    )
    assert code == 2 and out == ""
    assert message in err


def test_a_recursive_schema_that_descends_into_the_data_validates_and_checks_input(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        HEAD + "spec:\n  input:\n    $defs:\n      tree:\n        type: object\n"
        "        required: [name]\n        properties:\n          name: {type: string}\n"
        "          children: {type: array, items: {$ref: '#/$defs/tree'}}\n"
        "    $ref: '#/$defs/tree'\n  nodes: [{id: a, transform: '.run.input.name'}]\n",
    )
    assert invoke("validate", str(path))[0] == 0
    good = '{"name": "root", "children": [{"name": "leaf"}]}'
    state = str(tmp_path / "runs")
    assert invoke("run", str(path), "--state-dir", state, "--input-json", good, "-q")[0] == 0
    code, _, err = invoke(
        "run", str(path), "--state-dir", state, "--input-json", '{"name": "r", "children": [{}]}'
    )
    assert code != 0 and "'name' is a required property" in err


def test_an_agent_tool_schema_with_a_remote_ref_is_refused(
    tmp_path: Path, listener: Listener
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "apiVersion: agentflows.io/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n"
        "  model: {name: openai/test}\n  tools:\n    - name: t\n"
        f"      parameters: {{$ref: '{listener.url}/params'}}\n"
        "      python: {script: 'print(1)'}\n"
    )
    code, out, _ = invoke("validate", str(path))
    assert code == 2
    assert f"{path}#1 (Agent a): spec.tools[0].parameters.$ref: '{listener.url}/params'" in out
    assert listener.paths == []


def test_the_shared_validator_never_retrieves_even_an_unchecked_schema(listener: Listener) -> None:
    validator = schemas.validator({"$ref": f"{listener.url}/schema"})
    with pytest.raises(referencing.exceptions.Unresolvable):
        list(validator.iter_errors("anything"))
    assert listener.paths == []


def test_data_checked_against_a_schema_with_a_remote_ref_is_a_mismatch_never_a_fetch(
    listener: Listener,
) -> None:
    # the operator checks a human's answer against the request's schema: a schema that slipped
    # past validation must neither fetch nor raise out of the reconcile
    found = schemas.mismatch({"$ref": f"{listener.url}/answer"}, {"a": 1})
    assert found is not None and found.bad_schema and found.where == "(schema)"
    assert listener.paths == []
    wrong = schemas.mismatch({"properties": {"n": {"type": "integer"}}}, {"n": "x"})
    assert wrong is not None and wrong.path == ("n",) and "integer" in wrong.message
