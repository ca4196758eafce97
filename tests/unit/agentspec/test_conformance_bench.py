"""bench/agentspec_conformance.py's agentflows half: every case gives its expected result.

The WayFlow half needs wayflowcore in its own environment, so it is the bench's alone; this
runs the same cases, documents and model scripts on agentflows (``--agentflows-only``).
"""

from tests.support import processes


def test_every_conformance_case_passes_on_agentflows() -> None:
    result = processes.run_bench("agentspec_conformance.py", "--agentflows-only")
    rows = result.stdout.splitlines()
    failed = [row for row in rows if "agentflows FAIL" in row]
    assert failed == [], result.stdout + result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert rows[-1] == "34 cases: agentflows 34/34 passed", result.stdout
