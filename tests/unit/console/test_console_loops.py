"""The run page of a loop lists each node's iterations, folded ones included.

A real local run (``agentflows run``) counts to 30 in a loop, so the engine folds iterations 2
to 20 of each node (``count#2-20``); the ``--local`` console serves its page over loopback HTTP.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import test_utils

from agentflows.cli import console_command
from agentflows.console import app
from tests.unit.console.test_console_local import AGENTFLOWS
from tests.unit.test_loop_folds import COUNT


@pytest.fixture
def counted(tmp_path: Path) -> Path:
    """The state directory of a finished local run of COUNT (30 iterations)."""
    (tmp_path / "count.yaml").write_text(COUNT)
    state = tmp_path / "runs"
    done = subprocess.run(
        [AGENTFLOWS, "run", "count.yaml", "--name", "c30", "--state-dir", str(state), "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return state


@pytest.fixture
async def console(counted: Path) -> AsyncIterator[test_utils.TestClient]:
    runs = console_command._local_runs(str(counted))
    async with test_utils.TestClient(test_utils.TestServer(app.local_app(runs))) as client:
        yield client


def _section(page: str, node: str) -> str:
    start = page.index(f'<section class="node" data-node="{node}">')
    return page[start : page.index("</section>", start)]


def _rows(table: str) -> list[list[str]]:
    rows = re.findall(r"<tr data-node=\"[^\"]+\">(.*?)</tr>", table, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in rows]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in row] for row in cells]


async def test_a_loop_node_s_section_lists_its_iterations_with_the_fold_in_its_place(
    console: test_utils.TestClient,
) -> None:
    answer = await console.get("/local/c30")
    assert answer.status == 200
    page = await answer.text()
    count = _section(page, "count")
    (table,) = re.findall(
        r'<table class="iterations" data-iterations="count">.*?</table>', count, re.S
    )
    rows = _rows(table)
    assert [row[:2] for row in rows] == [
        ["1", "count"],
        ["2 to 20", "count#2-20"],
        *([str(n), f"count#{n}"] for n in range(21, 31)),
    ]
    assert rows[1][2] == "Succeeded folded: 19 succeeded"
    assert all(row[2] == "Succeeded" for row in rows[2:])
    # every row follows the live updates of its record's phase
    assert table.count('data-field="phase"') == len(rows)
    assert "data-iterations" not in _section(page, "done")


async def test_a_fold_s_section_says_what_it_holds_and_iterations_after_it_read_it(
    console: test_utils.TestClient,
) -> None:
    page = await (await console.get("/local/c30")).text()
    fold = _section(page, "count#2-20")
    assert "these iterations are folded into one record" in fold
    assert "(.nodes.count.json // 0) + 1" in fold  # the definition of node count
    # iteration 21 read check of iteration 20, which is folded: its fold stands in
    assert "output of check#2-20 (.nodes.check)" in _section(page, "count#21")
