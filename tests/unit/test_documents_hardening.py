"""Every bad document gets one clear line per problem and exit 2: no traceback, hang or blow-up.

The inputs are the newcomer and fuzz reproducers (alias bombs, deep nesting, constructor errors,
binary files, duplicate keys, bad names, loose types, huge limits), run through the command a
user types.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agentflows.cli import main as cli

HEAD = "apiVersion: agentflows.io/v1alpha1\nkind: Flow\n"
NODES = '  nodes: [{id: a, transform: "=1"}]\n'


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def validate(tmp_path: Path, text: str | bytes, name: str = "f.yaml") -> tuple[int, list[str]]:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    code, out, _ = invoke("validate", str(path))
    return code, [line.removeprefix(f"{path}") for line in out.splitlines()]


def laughs(levels: int, value: str = '"lol"') -> str:
    """A billion-laughs list: each level repeats the previous one nine times."""
    lines = [f"    l0: &l0 [{','.join([value] * 9)}]"]
    for level in range(1, levels):
        lines.append(f"    l{level}: &l{level} [{','.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_a_423_byte_billion_laughs_is_refused_without_expanding_it(tmp_path: Path) -> None:
    text = HEAD + "metadata: {name: lol}\nspec:\n  input:\n" + laughs(9) + NODES
    assert len(text) < 600
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        "#1: spec.input.l6[0]: aliases expand the file beyond 4194304 bytes, the limit for a file"
        " (line 12)"
    ]


def test_an_alias_bomb_of_expressions_in_tool_args_is_refused(tmp_path: Path) -> None:
    text = (
        HEAD + "metadata: {name: lol}\nspec:\n  nodes:\n  - id: a\n    tool:\n"
        "      python: {script: 'print(1)'}\n      args:\n"
        + laughs(9, '"=.run"').replace("    l", "        l")
    )
    code, lines = validate(tmp_path, text)
    assert code == 2 and len(lines) == 1
    assert "spec.nodes[0].tool.args.l" in lines[0]
    assert "aliases expand the file beyond 4194304 bytes" in lines[0]


@pytest.mark.parametrize("depth", [300, 20_000])
def test_deep_nesting_is_refused_with_the_limit(tmp_path: Path, depth: int) -> None:
    text = (
        HEAD + "metadata: {name: deep}\nspec:\n" + NODES + f"  input: {'[' * depth}{']' * depth}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("#1: spec.input[0][0]")
    assert lines[0].endswith(": nested deeper than 100 levels (line 6)")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!float x", "cannot read 'x' as float"),
        ("!!bool x", "cannot read 'x' as bool"),
        ("!!timestamp x", "cannot read 'x' as a timestamp"),
        ("!!int 1.5", "cannot read '1.5' as int"),
        ("!!python/object/apply:os.system [echo]", "unsupported tag"),
    ],
)
def test_yaml_constructor_errors_are_a_problem_with_path_and_line(
    tmp_path: Path, value: str, message: str
) -> None:
    text = HEAD + f"metadata: {{name: a}}\nspec:\n  description: {value}\n" + NODES
    code, lines = validate(tmp_path, text)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"#1: spec.description: {message}")
    assert lines[0].endswith("(line 5)")


def test_a_date_is_kept_as_the_text_written_as_kubectl_does(tmp_path: Path) -> None:
    text = HEAD + "metadata: {name: a}\nspec:\n  description: 2024-02-30\n" + NODES
    assert validate(tmp_path, text) == (0, ["1 resource(s) valid"])


def test_binary_and_latin1_files_are_one_problem_each_and_other_files_still_report(
    tmp_path: Path,
) -> None:
    (tmp_path / "a_binary.yaml").write_bytes(bytes([0x89, 0xED, 0xBF, 0x82]) * 100)
    (tmp_path / "b_latin1.yaml").write_bytes(
        (HEAD + "metadata: {name: caf\xe9}\n").encode("latin-1")
    )
    (tmp_path / "c_good_but_wrong.yaml").write_text(
        HEAD + "metadata: {name: c}\nspec:\n  nodes: [{id: a, transform: '=1', colour: red}]\n"
    )
    code, out, _ = invoke("validate", str(tmp_path))
    assert code == 2
    assert out.splitlines() == [
        f"{tmp_path}/a_binary.yaml: not UTF-8 text: byte 0x89 at line 1, column 1"
        " (save the file as UTF-8)",
        f"{tmp_path}/b_latin1.yaml: not UTF-8 text: byte 0xe9 at line 3, column 21"
        " (save the file as UTF-8)",
        f"{tmp_path}/c_good_but_wrong.yaml#1 (Flow c): spec.nodes[0].colour: unknown field",
    ]


@pytest.mark.parametrize("metadata", ["5", "null", "a-string", "[]"])
def test_metadata_that_is_not_a_mapping_is_a_problem(tmp_path: Path, metadata: str) -> None:
    code, lines = validate(tmp_path, HEAD + f"metadata: {metadata}\nspec:\n" + NODES)
    assert code == 2
    assert any(line.startswith("#1 (Flow): metadata: Input should be") for line in lines)


def test_duplicate_keys_are_refused_naming_the_key_path_and_lines(tmp_path: Path) -> None:
    text = HEAD + (
        "metadata: {name: dup}\nspec:\n  nodes:\n    - id: a\n"
        "      transform: '=1'\n      transform: '=2'\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        '#1: spec.nodes[0].transform: duplicate key "transform" (first at line 7); kubectl'
        " refuses a mapping with a key twice (line 8)"
    ]


def test_keys_that_yaml_reads_as_the_same_value_are_still_two_keys(tmp_path: Path) -> None:
    text = HEAD + (
        "metadata: {name: keys}\nspec:\n  nodes:\n    - id: a\n"
        "      branch: {value: '=1', cases: {1: b, yes: c, true: d}}\n"
        "    - {id: b, transform: '=1'}\n    - {id: c, transform: '=1'}\n"
        "    - {id: d, transform: '=1'}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        '#1: spec.nodes[0].branch.cases.true: duplicate key "true" (first at line 7); kubectl'
        " refuses a mapping with a key twice (line 7)"
    ]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ('{name: "Grüße Flow!"}', '"Grüße Flow!" is not a valid name'),
        ("{labels: {a: b}}", "required: set the object's name"),
        ("{name: ../../escaped}", '"../../escaped" is not a valid name'),
        ("{name: " + "x" * 300 + "}", "is not a valid name"),
        ("{name: " + "x" * 64 + "}", "at most 63 characters"),
    ],
)
def test_a_flow_name_a_cluster_would_refuse_is_refused(
    tmp_path: Path, metadata: str, message: str
) -> None:
    code, lines = validate(tmp_path, HEAD + f"metadata: {metadata}\nspec:\n" + NODES)
    assert code == 2 and len(lines) == 1
    assert ": metadata.name: " in lines[0] and message in lines[0]


def test_a_second_resource_of_the_same_kind_and_name_is_refused(tmp_path: Path) -> None:
    flow = HEAD + "metadata: {name: same}\nspec:\n" + NODES
    (tmp_path / "one.yaml").write_text(flow)
    (tmp_path / "two.yaml").write_text(flow + "---\n" + flow)
    code, out, _ = invoke("validate", str(tmp_path))
    assert code == 2
    first = f"{tmp_path}/one.yaml#1 (Flow same)"
    assert out.splitlines() == [
        f'{tmp_path}/two.yaml#1 (Flow same): metadata.name: a second Flow "same" (the first is'
        f" {first})",
        f'{tmp_path}/two.yaml#2 (Flow same): metadata.name: a second Flow "same" (the first is'
        f" {first})",
    ]


def test_two_flows_in_a_file_one_without_a_name_is_a_message_not_a_traceback(
    tmp_path: Path,
) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        HEAD + "metadata: {name: one}\nspec:\n" + NODES + "---\n" + HEAD + "spec:\n" + NODES
    )
    code, _, err = invoke("run", str(path), "--state-dir", str(tmp_path / "runs"))
    assert code == 2
    assert f"{path}#2 (Flow): metadata.name: required: set the object's name" in err


def test_an_empty_file_has_no_resource_and_run_says_there_is_no_flow(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    code, out, _ = invoke("validate", str(path))
    assert (code, out) == (2, f"no Agent, Flow or FlowRun in {path}\n")
    code, _, err = invoke("run", str(path), "--state-dir", str(tmp_path / "runs"))
    assert code == 2 and f"error: no Flow in {path}" in err


def test_strings_and_floats_are_not_coerced_into_numbers(tmp_path: Path) -> None:
    text = HEAD + (
        "metadata: {name: lax}\nspec:\n  nodes:\n    - id: fan\n      map:\n"
        "        items: '=[1,2]'\n        concurrency: '4'\n        maxItems: 10.0\n"
        "        tool: {python: {script: 'print(1)'}}\n"
        "  limits: {maxTokens: true, timeoutSeconds: '30'}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        '#1 (Flow lax): spec.nodes[0].map.concurrency: Input should be a valid integer (got "4")',
        "#1 (Flow lax): spec.nodes[0].map.maxItems: Input should be a valid integer (got 10.0)",
        '#1 (Flow lax): spec.limits.timeoutSeconds: Input should be a valid integer (got "30")',
        "#1 (Flow lax): spec.limits.maxTokens: Input should be a valid integer (got true)",
    ]


def test_huge_limits_are_refused_with_their_bounds(tmp_path: Path) -> None:
    text = HEAD + (
        "metadata: {name: huge}\nspec:\n" + NODES + "  limits:\n"
        f"    timeoutSeconds: {10**68}\n    maxTokens: {2**128 + 1}\n    maxCostUSD: .inf\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        "#1 (Flow huge): spec.limits.timeoutSeconds: Input should be less than or equal to"
        " 31536000",
        "#1 (Flow huge): spec.limits.maxTokens: Input should be less than or equal to"
        " 1000000000000",
        "#1 (Flow huge): spec.limits.maxCostUSD: .inf is not a finite number (JSON has no"
        " infinity or NaN) (line 9)",
    ]


def test_a_lone_surrogate_escape_is_refused_with_its_line(tmp_path: Path) -> None:
    text = HEAD + (
        "metadata: {name: s}\nspec:\n  nodes:\n    - id: a\n      tool:\n"
        "        python: {script: 'print(1)'}\n        args: {x: \"\\ud800\"}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        "#1: malformed YAML: line 9, column 22: found invalid Unicode character escape code"
    ]


def test_a_directory_is_read_recursively_and_what_is_skipped_is_said(tmp_path: Path) -> None:
    (tmp_path / "nested" / "deeper").mkdir(parents=True)
    (tmp_path / "nested" / "deeper" / "flow.yaml").write_text(
        HEAD + "metadata: {name: deep}\nspec:\n  nodes: [{id: a, transform: '=.x | '}]\n"
    )
    (tmp_path / "kustomization.yaml").write_text("resources: [nested/deeper/flow.yaml]\n")
    (tmp_path / "sa.yaml").write_text("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n")
    code, out, err = invoke("validate", str(tmp_path))
    assert code == 2
    assert out.startswith(
        f"{tmp_path}/nested/deeper/flow.yaml#1 (Flow deep): spec.nodes[0].transform: jq syntax"
    )
    assert f"skipped {tmp_path}/kustomization.yaml: a kustomization, not a resource" in err
    assert f"skipped {tmp_path}/sa.yaml#1 (ServiceAccount x): not an agentflows.io resource" in err


def test_a_wrong_type_does_not_hide_the_graph_problems_behind_it(tmp_path: Path) -> None:
    text = HEAD + (
        "metadata: {name: mixed}\nspec:\n  nodes:\n"
        "    - {id: a, transform: '=1'}\n"
        "    - id: fan\n      map: {items: '=[1]', concurrency: '4', agent: {name: x, prompt: p}}\n"
        "    - {id: ask, agent: {name: ghost, prompt: hi}}\n"
        "    - {id: orphan, transform: '=3'}\n"
        "  edges: [{from: a, to: fan}, {from: fan, to: ask}]\n"
        "  limits: {timeoutSeconds: soon}\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert lines == [
        '#1 (Flow mixed): spec.nodes[1].map.concurrency: Input should be a valid integer (got "4")',
        '#1 (Flow mixed): spec.limits.timeoutSeconds: Input should be a valid integer (got "soon")',
        '#1 (Flow mixed): spec.nodes[2].agent.name: no Agent "ghost"',
        '#1 (Flow mixed): spec.nodes[3]: node "orphan" is unreachable: no edge leads to it from'
        ' the start node "a"',
    ]


# --- found by the fuzzer (tests/unit/test_fuzz_documents.py, bench/fuzz.py) ----------------


def test_a_kind_that_is_a_mapping_is_a_problem_not_a_type_error(tmp_path: Path) -> None:
    code, lines = validate(
        tmp_path, "apiVersion: agentflows.io/v1alpha1\nkind:\n  properties:\nmetadata: {name: x}\n"
    )
    assert code == 2
    assert any("kind: unknown kind" in line for line in lines), lines


def test_a_parser_message_over_several_lines_is_reported_on_one(tmp_path: Path) -> None:
    code, lines = validate(tmp_path, b"\x1b")
    assert code == 2
    assert len(lines) == 1 and "control characters are not allowed" in lines[0], lines


def test_an_unknown_field_next_to_a_bad_value_in_an_approval_is_reported_with_it(
    tmp_path: Path,
) -> None:
    text = (
        "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: f}\nspec:\n"
        "  nodes:\n  - id: a\n    approval:\n      message: {a: {$ref: '#'}}\n"
        "      apiVersion: x\n"
    )
    code, lines = validate(tmp_path, text)
    assert code == 2
    assert any("spec.nodes[0].approval.message" in line for line in lines), lines


def test_a_name_with_a_newline_keeps_its_problem_on_one_line(tmp_path: Path) -> None:
    code, lines = validate(tmp_path, 'metadata: {name: "two\\nlines"}\nspec: {}\n')
    assert code == 2
    # the name is shown escaped, so no problem line is broken in two
    assert lines and all(line.startswith("#1 (two\\nlines): ") for line in lines), lines
