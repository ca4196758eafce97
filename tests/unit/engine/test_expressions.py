"""Where and how expressions run: in-process only when provably cheap, else bounded in a worker.

Attacks (``$ENV``, loops, memory) are in ``tests/unit/security/test_attack_expressions.py``;
these tests hold the line between the in-process path and the worker pool, the agreement of
the two, and the bounds on compiling (YAML aliases, repeated programs).
"""

from __future__ import annotations

import asyncio
import time

import jq
import pytest

from agentflows.engine import expressions, graph, jqsandbox

from .helpers import agents, flow_spec

#: The issue's reproducer v7: ten-fold YAML aliases, five deep, over ten expressions.
ALIAS_BOMB = """
nodes:
  - id: a
    tool:
      python: {script: 'print(1)'}
      args:
        x0: &a0 ["=.run", "=.run", "=.run", "=.run", "=.run", "=.run", "=.run", "=.run", "=.run", "=.run"]
""" + "".join(
    f"        x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 5)
)  # ~0.9 MB expanded: under the loader's 4 MiB bound


def in_process(program: str, scope: expressions.Scope | None = None) -> bool:
    compiled = expressions.compile_expression(program).program
    assert compiled is not None
    return compiled.in_process(scope or expressions.Scope({"a": [1, 2], "s": "ab"}))


@pytest.mark.parametrize(
    "program",
    [
        ".nodes.plan.json.questions",
        "{topic: .run.input.topic, findings: [.nodes.research.items[].json.findings[]]}",
        ".nodes.publish.json // .nodes.done.json",
        '.event.object.metadata.labels.app == "web"',
        "[.items[] | select(.ok)] | length",
        '.x | join(", ")',
        '"\\(.a) and \\(.b)"',
        "if .n > 3 then .n - 1 else -1 end",
        "{a, b} | tojson",
        "to_entries | map(.key)",
    ],
)
def test_common_expressions_run_in_process(program: str) -> None:
    assert in_process(program)


@pytest.mark.parametrize(
    "program",
    [
        "def f: f; f",
        "[range(1e9)]",
        ".s | . + . | . + . | . + . | . + . | . + .",  # doubles per stage
        "{a: .x[], b: .y[]}",  # cartesian product
        "[.a[] + .a[]]",
        "[.[] | select(.[])] | tojson",  # quadratic
        '"x" * .n',  # (a constant one is refused as it compiles)
        ".[1e9] = 1",
        "[.a[]] - [.b[]]",
        "tojson | tojson | tojson",
        ".x | join(.s)",
        "strftime(.f)",
        '.s | test("(a+)+$")',
        ".a | indices(.b)",
        "[.. | numbers]",
        "reduce .[] as $x (0; . + $x)",
        "[limit(3; repeat(1))]",
        "(.a, .a) | (.a, .a) | (.a, .a)",
    ],
)
def test_programs_that_can_outgrow_their_input_never_run_in_process(program: str) -> None:
    assert not in_process(program)


def test_a_cheap_program_over_a_large_input_runs_bounded_with_the_same_answer() -> None:
    small = expressions.Scope({"a": [1, 2, 3]})
    large = expressions.Scope({"a": list(range(40_000))})
    assert in_process(".a | length", small) and not in_process(".a | length", large)
    template = expressions.compile_expression(".a | length")
    assert expressions.evaluate(template, small) == 3
    assert expressions.evaluate(template, large) == 40_000


@pytest.mark.parametrize(
    "program",
    ['[.a[] | tostring] | join("-")', "[.a[] | . * 2]", '.s | test("b")', "[.a[] as $x | $x]"],
)
def test_the_worker_and_the_in_process_path_agree(program: str) -> None:
    values = {"a": [1, 2, 3], "s": "abc"}
    small = expressions.evaluate(expressions.compile_expression(program), expressions.Scope(values))
    padded = {**values, "pad": "x" * (expressions.CHEAP_INPUT_BYTES + 1)}
    template = expressions.compile_expression(program)
    assert expressions.evaluate(template, expressions.Scope(padded)) == small


def test_a_jq_error_in_the_worker_reads_like_one_in_process() -> None:
    template = expressions.compile_expression('if .s | test("a") then error("boom") else 1 end')
    with pytest.raises(expressions.ExpressionError, match=r"^jq .*: boom"):
        expressions.evaluate(template, expressions.Scope({"s": "a"}))


def test_a_result_larger_than_the_limit_is_refused_not_parsed() -> None:
    template = expressions.compile_expression('"x" * 20000000')
    with pytest.raises(expressions.ExpressionLimit, match=r"result exceeded 16 MiB"):
        expressions.evaluate(template, expressions.Scope({}, deadline=time.monotonic() + 30))


def test_no_expression_starts_once_the_deadline_has_passed() -> None:
    template = expressions.compile_expression("[limit(3; repeat(1))]")
    scope = expressions.Scope({}, deadline=time.monotonic() - 1)
    with pytest.raises(expressions.ExpressionError, match="the run's time limit has passed"):
        expressions.evaluate(template, scope)


async def test_a_bounded_evaluation_leaves_the_event_loop_running() -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    template = expressions.compile_expression("def f: f; f")
    with pytest.raises(expressions.ExpressionLimit, match=r"exceeded 0\.5 s"):
        await expressions.evaluate_async(
            template, expressions.Scope({}, deadline=time.monotonic() + 0.5)
        )
    ticker.cancel()
    assert ticks >= 3


def test_an_alias_bomb_with_expressions_is_refused_with_its_size() -> None:
    found = [str(p) for p in graph.validate(flow_spec(ALIAS_BOMB), graph.StaticResolver(agents()))]
    assert found == [
        "spec.nodes[0].tool.args: expands to 111,111 or more values to evaluate (YAML aliases "
        "repeat what they point to); at most 100,000 are allowed"
    ]


def test_a_value_repeated_by_aliases_is_compiled_once() -> None:
    shared = {"k": "x {{ .run }}", "j": "=.run.x"}
    template = expressions.compile_template({"a": shared, "b": shared, "c": [shared, shared]})
    compiled = {id(child) for _, child in template.children[:2]}
    compiled |= {id(item) for item in template.children[2][1].items}
    assert len(compiled) == 1
    # Evaluating still visits each repeat: {k: "x " + program, j: program} is 4, four times.
    assert template.weight == 1 + 4 + 4 + (1 + 4 + 4)


def test_an_evaluator_killed_while_idle_is_replaced() -> None:
    template = expressions.compile_expression('.s | test("a")')
    assert expressions.evaluate(template, expressions.Scope({"s": "a"})) is True
    for worker in list(jqsandbox._POOL._idle):
        worker.process.kill()
        worker.process.wait()
    assert expressions.evaluate(template, expressions.Scope({"s": "b"})) is False


@pytest.mark.parametrize(
    "programs",
    [
        ['"a', 'b"'],  # together, one string literal
        [".a)", "(.b"],  # together, balanced
        [".a # c", ".b"],  # a comment that would swallow the next one
        ["def f: 1;", ".x"],  # valid alone, not inside parentheses
        [".a", ".b", "{{", ".c"],
        [".a", "$__loc__", ".x | length"],
    ],
)
def test_programs_checked_together_are_accepted_exactly_when_each_compiles_alone(
    programs: list[str],
) -> None:
    def alone(source: str) -> bool:
        try:
            jq.compile(source)
        except ValueError:
            return False
        return True

    values = ["=" + p + " " for p in programs]  # sources never seen before by the cache
    bad = [p + " " for p in programs if not alone(p + " ")]
    if not bad:
        expressions.compile_template(values)
        return
    with pytest.raises(expressions.ExpressionError) as raised:
        expressions.compile_template(values)
    assert repr(bad[0]) in str(raised.value)
