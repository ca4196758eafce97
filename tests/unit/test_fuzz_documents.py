"""Property-based fuzz of what users hand ``agentflows validate`` and ``agentflows run --dry-run``.

Each case (tests/support/document_fuzz.py: mutated examples and reproducers, generated Flows,
random bytes) runs in a forked child (tests/support/fuzz_harness.py) and must keep every
invariant of issue 10, section 6: no exception but a validation result, every problem names
its file, document and field path, a valid document runs to a defined exit code (exit 1 only
for a Failed run), nothing is written outside the state directory, and no case grows by more
than 300 MB. A case still running after 30 s (15 times the 2 s budget; bench/fuzz.py enforces
the budget itself) is stopped and counts as a hang, so the suite never hangs on one.

The profile is derandomized, with no example database, so CI runs the same 150 cases every
time; shrinking is off (a hang would be shrunk at 30 s a try): ``bench/fuzz.py --out DIR``
writes minimal reproducers. The failure message carries the case's files in full.
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.support import document_fuzz, fuzz_harness

#: Memory a case may add (resident, C allocations included).
MEMORY_LIMIT_MB = 300
#: Past this a case is stopped: far above the 2 s budget, so a noisy machine never trips it.
HANG_SECONDS = 30


@settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)
@given(document_fuzz.cases())
def test_any_document_is_refused_with_a_located_message_or_runs_to_a_defined_exit_code(
    case: fuzz_harness.Case,
) -> None:
    outcome = fuzz_harness.run_isolated(case, timeout=HANG_SECONDS, memory_mb=MEMORY_LIMIT_MB)
    assert outcome.ok, outcome.report(case)


REPRODUCERS = sorted((document_fuzz.REPO / "tests" / "data" / "fuzz").glob("*.yaml"))


@pytest.mark.parametrize("reproducer", REPRODUCERS, ids=[path.stem for path in REPRODUCERS])
def test_each_filed_reproducer_as_filed_is_refused_with_a_located_message_or_runs(
    reproducer: Path,
) -> None:
    # The generated cases mutate these files; this runs each one unmutated, so every input
    # issue 10 filed is kept by a test whatever the strategies draw.
    case = fuzz_harness.Case(((reproducer.name, reproducer.read_bytes()),))
    outcome = fuzz_harness.run_isolated(case, timeout=HANG_SECONDS, memory_mb=MEMORY_LIMIT_MB)
    assert outcome.ok, outcome.report(case)
