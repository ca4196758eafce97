"""Smoke tests of bench/: the quick runs of engine.py and kopf_watch.py finish and print every row
(never timings); the operator benchmark offers its modes."""

import pytest

from tests.support import processes

pytest.importorskip("langgraph")


def test_quick_engine_benchmark_prints_every_graph_the_loop_ratios_and_the_startup_line() -> None:
    result = processes.run_bench("engine.py", "--quick")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert any(line.startswith("chain-100 ") for line in rows), result.stdout
    assert any(line.startswith("fanout-1-32-1 ") for line in rows), result.stdout
    assert any(line.startswith("loop-100 ") for line in rows), result.stdout
    assert any(line.startswith("loop-100 per node / chain-100 per node, measured") for line in rows)
    assert any("unrolled (50 iterations, no back edge" in line for line in rows), result.stdout
    assert any(line.startswith("cli start -> first node: ") for line in rows), result.stdout


def test_operator_benchmark_offers_quick_and_failover_modes() -> None:
    # The operator benchmark needs a control plane and minutes; its help proves it imports.
    result = processes.run_bench("operator_scale.py", "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--quick" in result.stdout, result.stdout
    assert "--failover" in result.stdout, result.stdout


def test_quick_kopf_watch_benchmark_feeds_every_event_through_both_watch_layers() -> None:
    # The bench itself exits non-zero when a side did not reconcile every held run and every
    # streamed run's key; here its rows are checked to be printed for both sides (never timings).
    pytest.importorskip("kopf")
    result = processes.run_bench("kopf_watch.py", "--quick")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    for side in ("kopf", "ours"):
        assert any(line.startswith(f"{side} held 200: ready ") for line in rows), result.stdout
    assert any(line.startswith("CPU per event (least of the sizes): kopf ") for line in rows), (
        result.stdout
    )
