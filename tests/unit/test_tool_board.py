"""The tool board the cluster tests share with their runs' tools (tests/support/tool_board.py).

A tool's side (:data:`tool_board.CLIENT`) runs in a python process of its own, as a python tool
does, and talks to the board over real HTTP on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.tool_board import CLIENT, ToolBoard

TOOL = (
    CLIENT
    + """
import json, sys
args = json.load(sys.stdin)
before = exists(args["release"])
append(args["count"], "ran\\n")
append(args["count"], "ran\\n")
print(json.dumps({"before": before, "released": exists(args["release"]), "count": read(args["count"])}))
"""
)


@pytest.fixture
def board() -> Iterator[ToolBoard]:
    started = ToolBoard().start()
    try:
        yield started
    finally:
        started.stop()


def run_tool(args: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", TOOL], input=json.dumps(args), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_a_tool_appends_to_a_board_file_and_sees_a_release_the_test_wrote(
    board: ToolBoard,
) -> None:
    count, release = board / "calls.count", board / "release"
    assert not count.exists()
    first = run_tool({"count": str(count), "release": str(release)})
    assert first == {"before": False, "released": False, "count": "ran\nran\n"}
    release.touch()
    second = run_tool({"count": str(count), "release": str(release)})
    assert second["before"] is True
    assert count.read_text() == "ran\n" * 4


def test_a_file_no_one_wrote_is_absent_on_both_sides(board: ToolBoard) -> None:
    missing = board / "never"
    assert not missing.exists()
    with pytest.raises(FileNotFoundError):
        missing.read_text()
    with pytest.raises(ValueError, match="one path segment"):
        board / "a/b"
