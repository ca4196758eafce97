"""A bad Flow is explained, one problem per line naming its path, and nothing runs."""

from __future__ import annotations

import pytest

from agentflows.api import documents
from agentflows.engine import graph

from .helpers import agents, flow_spec


def problems(text: str, *agent_names: str) -> list[str]:
    return [
        str(p) for p in graph.validate(flow_spec(text), graph.StaticResolver(agents(*agent_names)))
    ]


def test_branch_case_naming_no_node_is_reported_at_its_path() -> None:
    found = problems("""
nodes:
  - {id: a, transform: "=1"}
  - {id: b, transform: "=2"}
  - {id: c, transform: "=3"}
  - id: route
    branch: {value: "=.nodes.a.json", cases: {bug: fix, ok: c}}
edges:
  - {from: a, to: b}
  - {from: b, to: route}
""")
    assert 'spec.nodes[3].branch.cases.bug: no node "fix"' in found


def test_duplicate_ids_are_reported_with_the_first_occurrence() -> None:
    found = problems("""
nodes:
  - {id: a, transform: "=1"}
  - {id: a, transform: "=2"}
""")
    assert found == ['spec.nodes[1].id: duplicate node id "a" (first at spec.nodes[0])']


def test_unreachable_node_is_reported() -> None:
    found = problems("""
nodes:
  - {id: a, transform: "=1"}
  - {id: b, transform: "=2"}
  - {id: orphan, transform: "=3"}
edges:
  - {from: a, to: b}
""")
    assert found == [
        'spec.nodes[2]: node "orphan" is unreachable: no edge leads to it from the start node "a"'
    ]


def test_jq_syntax_error_is_reported_at_validation() -> None:
    found = problems("""
nodes:
  - {id: a, transform: "=.x | "}
""")
    assert len(found) == 1 and found[0].startswith("spec.nodes[0].transform: jq syntax error")


def test_jq_error_inside_interpolation_is_reported() -> None:
    found = problems(
        """
nodes:
  - {id: a, agent: {name: a, prompt: "hi {{ .run.input[ }}"}}
""",
        "a",
    )
    assert len(found) == 1 and found[0].startswith("spec.nodes[0].agent.prompt: jq syntax error")


def test_unknown_agent_is_reported() -> None:
    found = problems("""
nodes:
  - {id: a, agent: {name: ghost, prompt: hi}}
""")
    assert found == ['spec.nodes[0].agent.name: no Agent "ghost"']


def test_cycle_without_an_exit_is_refused_naming_its_nodes() -> None:
    found = problems("""
nodes:
  - {id: a, transform: "=1"}
  - {id: b, transform: "=2"}
  - {id: c, transform: "=3"}
edges:
  - {from: a, to: b}
  - {from: b, to: c}
  - {from: c, to: b}
""")
    assert (
        "spec.edges: loop b -> c -> b has no exit: a loop must pass through a branch node with a case or default leading out of it"
        in found
    )


def test_edge_to_unknown_node_and_wrong_branch_label_are_reported() -> None:
    found = problems("""
nodes:
  - {id: a, branch: {value: "=1", cases: {x: b}, default: c}}
  - {id: b, transform: "=2"}
  - {id: c, transform: "=3"}
edges:
  - {from: a, to: nowhere}
  - {from: a, to: c, branch: x}
""")
    assert 'spec.edges[0].to: no node "nowhere"' in found
    assert 'spec.edges[1].branch: case "x" of node "a" goes to "b", not "c"' in found


def test_unknown_fields_and_missing_fields_name_their_paths() -> None:
    result = documents.load_text(
        """
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: f}
spec:
  nodes:
    - {id: a, transform: "=1", colour: red}
    - {id: b}
""",
        "f.yaml",
    )
    found = [str(p) for p in result.problems]
    assert "f.yaml#1 (Flow f): spec.nodes[0].colour: unknown field" in found
    assert any(
        p.startswith("f.yaml#1 (Flow f): spec.nodes[1]: set exactly one of agent, llm")
        for p in found
    )


def test_malformed_yaml_is_one_problem_with_a_line_number() -> None:
    result = documents.load_text("kind: Flow\nspec: [a, b\n", "bad.yaml")
    assert len(result.problems) == 1
    assert str(result.problems[0]).startswith("bad.yaml#1: malformed YAML: line 3")


def test_boolean_and_number_case_keys_become_strings_as_kubectl_reads_them() -> None:
    spec = flow_spec("""
nodes:
  - id: a
    branch:
      value: "=1"
      cases: {1: b, yes: c}
  - {id: b, transform: "=2"}
  - {id: c, transform: "=3"}
""")
    assert spec.nodes[0].branch is not None and spec.nodes[0].branch.cases == {
        "1": "b",
        "true": "c",
    }


def test_a_bare_on_key_gets_a_hint_about_yaml_booleans() -> None:
    result = documents.load_text("""
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: f}
spec:
  nodes:
    - {id: a, branch: {on: "=1", cases: {}}}
""")
    found = [str(p) for p in result.problems]
    assert (
        "spec.nodes[0].branch.true: unknown field (YAML reads an unquoted on, off, yes, no, y or n as a boolean)"
        in found
    )


@pytest.mark.parametrize("schema_text", ["{type: objekt}"])
def test_invalid_output_schema_is_reported(schema_text: str) -> None:
    found = problems(f"""
nodes:
  - id: a
    llm: {{model: {{name: m}}, prompt: p, outputSchema: {schema_text}}}
""")
    assert len(found) == 1 and found[0].startswith(
        "spec.nodes[0].llm.outputSchema.type: not a valid JSON Schema"
    )


@pytest.mark.parametrize(
    ("schema_text", "expected"),
    [
        ("{type: string}", "spec.nodes[0].agent.answer.schema: must be a JSON Schema of an object"),
        (
            "{type: object, properties: {city: {type: strnig}}}",
            "spec.nodes[0].agent.answer.schema.properties.city.type: not a valid JSON Schema",
        ),
    ],
)
def test_an_agent_answer_that_is_not_an_object_schema_is_reported(
    schema_text: str, expected: str
) -> None:
    found = problems(
        f"""
nodes:
  - id: a
    agent: {{name: helper, prompt: p, answer: {{schema: {schema_text}}}}}
""",
        "helper",
    )
    assert len(found) == 1 and found[0].startswith(expected), found
