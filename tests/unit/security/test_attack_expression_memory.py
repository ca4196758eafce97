"""The expression memory limit is the limit (issue 19, item 6).

``'="x" * 2e9 | length'`` reached 1.96 GB under the evaluator's 512 MiB limit, three such nodes
2.9 GB in ``validate`` alone: jq folds constant expressions while it compiles, and programs
were compiled in the CLI's (the runner's, the operator's) own process to check their syntax.
Each test runs ``agentflows`` in a child process that reports the largest resident size of
everything it started (``RUSAGE_CHILDREN``: the CLI and its evaluator workers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentflows.engine import jqsandbox

LIMIT_MIB = jqsandbox.MEMORY_LIMIT_BYTES // (1024 * 1024)
HEAD = "apiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: m}\n"
_MEASURE = (
    "import json, resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
    "print(json.dumps([done.returncode, done.stdout + done.stderr, peak]))\n"
)


def _measured(*args: str) -> tuple[int, str, int]:
    """Exit code, output and peak resident bytes of ``agentflows ARGS`` and its children."""
    command = [str(Path(sys.executable).parent / "agentflows"), *args]
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True, check=True
    )
    code, output, peak = json.loads(done.stdout)
    return code, output, peak


def test_a_constant_string_bomb_is_refused_at_validation_within_the_memory_limit(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        HEAD + "spec:\n  nodes:\n"
        + "".join(f"    - {{id: {n}, transform: '=\"{n}\" * 1e9 | length'}}\n" for n in "abc")
        + "  edges: []\n"
    )  # fmt: skip
    code, output, peak = _measured("validate", str(flow))
    assert code == 2, output
    assert (
        f"spec.nodes[0].transform: jq '\"a\" * 1e9 | length': compiling it: expression "
        f"exceeded its memory limit ({LIMIT_MIB} MiB)"
    ) in output
    assert output.count("exceeded its memory limit") == 3
    assert peak < jqsandbox.MEMORY_LIMIT_BYTES, f"peak {peak // 2**20} MiB"


def test_a_string_bomb_from_the_input_fails_its_node_within_the_memory_limit(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        HEAD + "spec:\n  nodes: [{id: a, transform: '=\"x\" * .run.input.n | length'}]\n"
    )
    code, output, peak = _measured(
        "run", str(flow), "--state-dir", str(tmp_path / "s"), "--input", "n=2000000000"
    )
    assert code == 1, output
    assert f"expression exceeded its memory limit ({LIMIT_MIB} MiB)" in output
    assert peak < jqsandbox.MEMORY_LIMIT_BYTES, f"peak {peak // 2**20} MiB"
