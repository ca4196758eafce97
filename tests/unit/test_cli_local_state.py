"""Local state as an attacker and an unlucky user meet it: names, ownership, bad files.

Real ``agentflows`` subprocesses: a run name that is a path, a second process on a run that one
is running (the lock file), and state files that are not a run's state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_cli_local_runs import HELLO, HOLD_FLOW, _wait_for_node, agentflows

AGENTFLOWS = str(Path(sys.executable).parent / "agentflows")

COUNTED_HOLD_FLOW = HOLD_FLOW.replace(
    "            args = json.load(sys.stdin)\n",
    "            args = json.load(sys.stdin)\n"
    "            with open(args['counter'], 'a') as counter:\n"
    "                counter.write('started\\n')\n",
).replace("args: {release: RELEASE}", "args: {release: RELEASE, counter: COUNTER}")


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    """A state directory with two finished runs, ok-1 and ok-2."""
    state = tmp_path / "runs"
    for name in ("ok-1", "ok-2"):
        done = agentflows(
            "run", str(HELLO), "--input", "name=Ada", "--state-dir", str(state), "--name", name,
            "-q", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return state


@pytest.mark.parametrize("command", [["resume"], ["get", "--local"], ["graph", "--local"]])
def test_a_run_named_like_a_path_outside_the_state_directory_is_refused(
    command: list[str], two_runs: Path, tmp_path: Path
) -> None:
    # A complete run in another directory: resume would run it, get would show it.
    far = tmp_path / "far-away"
    far.mkdir()
    for suffix in (".json", ".snapshot.json"):
        (far / f"far{suffix}").write_bytes((two_runs / f"ok-1{suffix}").read_bytes())
    before = (far / "far.json").read_bytes()
    done = agentflows(*command, "../far-away/far", "--state-dir", str(two_runs), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "'../far-away/far' is not a run name" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert (far / "far.json").read_bytes() == before


@pytest.mark.parametrize("bad", ["[1,2,3]", '{"nodes": "x"}', '{"requests": [1]}', "{"])
def test_one_bad_state_file_is_reported_with_its_path_and_the_other_runs_still_work(
    bad: str, two_runs: Path, tmp_path: Path
) -> None:
    (two_runs / "ok-2.json").write_text(bad)
    bad_file = two_runs / "ok-2.json"
    listed = agentflows("list", "--state-dir", str(two_runs), "-o", "name", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["ok-1"]
    assert f"{bad_file}: not a run state" in listed.stderr
    pending = agentflows("requests", "--state-dir", str(two_runs), cwd=tmp_path)
    assert pending.returncode == 0 and f"{bad_file}: not a run state" in pending.stderr
    good = agentflows("get", "ok-1", "--state-dir", str(two_runs), "-o", "json", cwd=tmp_path)
    assert good.returncode == 0 and json.loads(good.stdout)["phase"] == "Succeeded"
    for command in ("get", "resume"):
        done = agentflows(command, "ok-2", "--state-dir", str(two_runs), cwd=tmp_path)
        assert done.returncode == 2, (command, done.stderr)
        assert f"{bad_file}: not a run state" in done.stderr
        assert "internal error" not in done.stderr


def test_a_second_process_on_a_running_run_exits_2_naming_the_owner_and_runs_nothing(
    tmp_path: Path, tool_dir: Path
) -> None:
    # Where the contained tool (its own uid when the tests run as root) may read and write.
    release, counter = tool_dir / "release", tool_dir / "counter"
    flow = tmp_path / "held.yaml"
    flow.write_text(
        COUNTED_HOLD_FLOW.replace("RELEASE", json.dumps(str(release))).replace(
            "COUNTER", json.dumps(str(counter))
        )
    )
    state = tmp_path / "runs"
    running = subprocess.Popen(
        [AGENTFLOWS, "run", str(flow), "--name", "held-1", "--state-dir", str(state), "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ}, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for_node(state / "held-1.json", "hold", "Running")
        for second in (
            ["resume", "held-1", "--state-dir", str(state)],
            ["run", str(flow), "--name", "held-1", "--state-dir", str(state)],
        ):
            done = agentflows(*second, cwd=tmp_path)
            assert done.returncode == 2, done.stderr
            assert "run held-1 is being run by another process" in done.stderr
            assert f"pid {running.pid} (agentflows run {flow}" in done.stderr
            assert " since 20" in done.stderr
        release.write_text("go")
        _, err = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert running.returncode == 0, err
    assert counter.read_text() == "started\n"  # the node ran once
    # Released with its process: the run can be owned again.
    again = agentflows("resume", "held-1", "--state-dir", str(state), cwd=tmp_path)
    assert "is being run by another process" not in again.stderr
