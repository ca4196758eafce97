"""Smoke test of bench/engine.py: the quick run finishes and prints every row (never timings)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

REPO = Path(__file__).resolve().parents[2]


def test_quick_engine_benchmark_prints_every_graph_the_loop_ratio_and_the_startup_line() -> None:
    result = subprocess.run(
        [sys.executable, "bench/engine.py", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert any(line.startswith("chain-100 ") for line in rows), result.stdout
    assert any(line.startswith("fanout-1-32-1 ") for line in rows), result.stdout
    assert any(line.startswith("loop-100 ") for line in rows), result.stdout
    assert any(line.startswith("loop-100 per node / chain-100 per node, measured") for line in rows)
    assert any(line.startswith("cli start -> first node: ") for line in rows), result.stdout


def test_operator_benchmark_offers_quick_and_failover_modes() -> None:
    # The operator benchmark needs a control plane and minutes; its help proves it imports.
    result = subprocess.run(
        [sys.executable, "bench/operator_scale.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--quick" in result.stdout, result.stdout
    assert "--failover" in result.stdout, result.stdout
