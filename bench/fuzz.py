"""Fuzz campaign: thousands of hostile documents through ``validate`` and ``run --dry-run``.

Run ``python bench/fuzz.py`` (10,000 cases) or ``python bench/fuzz.py --cases 2000 --out DIR``.
Cases come from the same hypothesis strategies as the unit-suite fuzz test
(tests/support/document_fuzz.py); each runs in a forked child (tests/support/fuzz_harness.py)
with a time limit (``--timeout``, 2 s: a case still running then is stopped with its stack
dumped) and a memory limit (``--memory-mb``, 300 MB of resident growth), so one hang or
blow-up costs one case, never the campaign. Prints cases/s and the failures grouped by kind,
exception type and the agentflows frame that raised it; with ``--out``, writes a minimized
reproducer of each group. Exits 1 when any case broke an invariant. See bench/README.md.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from tests.support import document_fuzz, fuzz_harness  # noqa: E402

#: The failing cases of one group, with what each did.
Members = list[tuple[fuzz_harness.Case, fuzz_harness.Outcome]]
#: Failing cases by group (kind | stage | exception | where).
Failures = dict[str, Members]


def generate(count: int, random_seed: int) -> list[fuzz_harness.Case]:
    """Draw ``count`` cases from the strategies (hypothesis as a generator only)."""
    cases: list[fuzz_harness.Case] = []

    @seed(random_seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(document_fuzz.cases())
    def collect(case: fuzz_harness.Case) -> None:
        cases.append(case)

    collect()
    return cases


class Campaign:
    """Runs cases with the watchdog and keeps the outcomes."""

    def __init__(self, timeout: float, memory_mb: float, jobs: int) -> None:
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.jobs = jobs
        self.evaluations = 0

    def run(self, case: fuzz_harness.Case) -> fuzz_harness.Outcome:
        """One case in a forked child."""
        self.evaluations += 1
        return fuzz_harness.run_isolated(case, self.timeout, self.memory_mb)

    def run_all(self, cases: list[fuzz_harness.Case], progress: bool) -> list[fuzz_harness.Outcome]:
        """Every case, ``jobs`` at a time, printing a progress line every 500."""
        outcomes: list[fuzz_harness.Outcome] = []
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            for outcome in pool.map(self.run, cases):
                outcomes.append(outcome)
                if progress and len(outcomes) % 500 == 0:
                    failed = sum(not o.ok for o in outcomes)
                    print(f"  {len(outcomes)} cases, {failed} failed", file=sys.stderr)
        return outcomes


def _size(case: fuzz_harness.Case) -> int:
    return sum(len(content) for _, content in case.files)


def _without(case: fuzz_harness.Case, file_index: int, lines: list[bytes]) -> fuzz_harness.Case:
    files = list(case.files)
    files[file_index] = (files[file_index][0], b"\n".join(lines))
    return fuzz_harness.Case(tuple(files), case.run_name, case.state_dir_is_a_file)


def minimize(
    case: fuzz_harness.Case, group: str, campaign: Campaign, budget: int
) -> fuzz_harness.Case:
    """Drop files and line ranges that the failure does not need (ddmin, ``budget`` tries)."""
    tries = 0
    while len(case.files) > 1 and tries < budget:
        for index in range(len(case.files)):
            tries += 1
            smaller = fuzz_harness.Case(
                case.files[:index] + case.files[index + 1 :],
                case.run_name,
                case.state_dir_is_a_file,
            )
            if campaign.run(smaller).group() == group:
                case = smaller
                break
        else:
            break
    for index in range(len(case.files)):
        lines = case.files[index][1].split(b"\n")
        chunk = max(1, len(lines) // 2)
        while chunk >= 1 and tries < budget:
            start, shrunk = 0, False
            while start < len(lines) and tries < budget:
                candidate = lines[:start] + lines[start + chunk :]
                tries += 1
                if candidate and campaign.run(_without(case, index, candidate)).group() == group:
                    lines, shrunk = candidate, True
                else:
                    start += chunk
            if not shrunk:
                chunk //= 2
        case = _without(case, index, lines)
    return case


def _slug(group: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", group).strip("-").lower()[:70]


def write_reproducers(
    groups: Failures,
    out: Path,
    campaign: Campaign,
    budget: int,
) -> None:
    """Per group: the smallest case, minimized, with a report of what it did."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for number, (group, members) in enumerate(_ordered(groups), start=1):
        case, _ = min(members, key=lambda member: _size(member[0]))
        case = minimize(case, group, campaign, budget)
        outcome = campaign.run(case)
        directory = out / f"{number:02d}-{_slug(group)}"
        directory.mkdir()
        for name, content in case.files:
            (directory / name).write_bytes(content)
        (directory / "report.txt").write_text(
            f"{group}\n{len(members)} case(s) of {campaign.evaluations} evaluations\n"
            f"run --name: {case.run_name!r}; state dir is a file: {case.state_dir_is_a_file}\n"
            f"reproduced: {outcome.group() == group} ({outcome.seconds:.2f} s, "
            f"+{outcome.peak_mb:.0f} MB)\n\n{outcome.detail}\n",
            errors="backslashreplace",
        )


def _ordered(
    groups: Failures,
) -> list[tuple[str, Members]]:
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def summarize(
    cases: list[fuzz_harness.Case], outcomes: list[fuzz_harness.Outcome], seconds: float
) -> Failures:
    """Print the figures and the failure table; return the failures by group."""
    kinds = collections.Counter(o.kind for o in outcomes)
    groups: Failures = collections.defaultdict(list)
    for case, outcome in zip(cases, outcomes, strict=True):
        if not outcome.ok:
            groups[outcome.group()].append((case, outcome))
    slowest = max(outcomes, key=lambda o: o.seconds)
    largest = max(outcomes, key=lambda o: o.peak_mb)
    rate = len(outcomes) / seconds
    print(f"cases            {len(outcomes)} in {seconds:.1f} s: {rate:.1f} cases/s")
    print(f"accepted (ran)   {kinds['accepted']}")
    print(f"rejected         {kinds['rejected']}")
    failed = sum(len(members) for members in groups.values())
    print(f"failed           {failed} in {len(groups)} groups")
    for kind in ("crash", "hang", "over-memory", "killed", "unplaced", "bad-exit", "escaped"):
        print(f"  {kind:14} {kinds[kind]}")
    print(f"slowest case     {slowest.seconds:.2f} s; most memory +{largest.peak_mb:.0f} MB")
    if groups:
        print("\ncount  group (kind | stage | exception | where)")
        for group, members in _ordered(groups):
            print(f"{len(members):5}  {group}")
    return groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases to run (10000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (0)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per case (2)")
    parser.add_argument("--memory-mb", type=float, default=300, help="memory per case (300)")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (1)")
    parser.add_argument("--out", type=Path, help="write a minimized reproducer per group here")
    parser.add_argument("--shrink-budget", type=int, default=40, help="tries per group (40)")
    args = parser.parse_args()

    started = time.perf_counter()
    cases = generate(args.cases, args.seed)
    print(f"generated        {len(cases)} cases in {time.perf_counter() - started:.1f} s")
    fuzz_harness.warm_up()
    campaign = Campaign(args.timeout, args.memory_mb, args.jobs)
    started = time.perf_counter()
    outcomes = campaign.run_all(cases, progress=True)
    groups = summarize(cases, outcomes, time.perf_counter() - started)
    if args.out is not None and groups:
        write_reproducers(groups, args.out, campaign, args.shrink_budget)
        print(f"\nreproducers in {args.out}/ (one directory per group, report.txt in each)")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())
