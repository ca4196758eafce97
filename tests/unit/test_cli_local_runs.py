"""Local runs as a user drives them: names, state directories, exit codes, Ctrl-C, resume hints.

Commands run as subprocesses where the shell matters (pasting a printed command, Ctrl-C,
completion, exit codes of crashes) and in-process with click's runner elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from agentflows.api import flowrun as flowrun_api
from agentflows.cli import group, local, local_runs
from agentflows.cli import main as cli
from agentflows.engine import store

ROOT = Path(__file__).resolve().parents[2]
RESEARCH = ROOT / "examples" / "research.yaml"
HELLO = ROOT / "examples" / "hello.yaml"
ONBOARDING = ROOT / "examples" / "onboarding.yaml"
FUZZ = Path("/work/shared/reproducers/fuzz")
AGENTFLOWS = str(Path(sys.executable).parent / "agentflows")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def agentflows(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``agentflows ARGS`` in a subprocess (the installed console script), as a user runs it."""
    return subprocess.run(
        [AGENTFLOWS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )


# --- run names and the state directory ------------------------------------------------------


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute-run", "Bad Name!", "x" * 64])
def test_a_run_name_that_is_not_a_dns_label_is_refused_and_nothing_is_written(
    name: str, tmp_path: Path
) -> None:
    state = tmp_path / "a" / "b" / "runs"
    code, out, err = invoke(
        "run", str(HELLO), "--input", "name=Ada", "--state-dir", str(state), "--name", name
    )
    assert code == 2 and out == ""
    assert "a run name is at most 63 lower-case letters, digits and '-'" in err
    assert not state.exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_flow_named_like_a_path_writes_nothing_outside_the_state_directory(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text((FUZZ / "r5-metadata-name-path-traversal.yaml").read_text())
    state = tmp_path / "deep" / "er" / "runs"
    code, _, err = invoke("run", str(flow), "--state-dir", str(state), "-q")
    assert code in (0, 2), err  # 2 once metadata.name itself is validated
    assert {p.parent for p in tmp_path.rglob("*.json")} <= {state}


@pytest.mark.parametrize(
    "flow_name", ["x" * 300, "../../../escaped", "Grüße Flow!", "a.b.c", "-", ""]
)
def test_generated_run_names_are_valid_run_names_whatever_the_flow_name(flow_name: str) -> None:
    name = local.new_run_name(flow_name)
    assert local.check_run_name(name) == name
    assert len(name) <= 63 and "/" not in name


def test_a_state_dir_that_is_a_file_is_a_clear_error_with_exit_2(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    for state in (taken, taken / "runs"):
        code, out, err = invoke("run", str(HELLO), "--input", "name=Ada", "--state-dir", str(state))
        assert code == 2 and out == ""
        assert err.startswith(f"error: cannot keep run state in {state}: ")
        assert "Traceback" not in err


def test_a_missing_required_input_exits_2_and_writes_no_state(tmp_path: Path) -> None:
    code, out, err = invoke("run", str(RESEARCH), "--state-dir", str(tmp_path / "runs"))
    assert code == 2 and out == ""
    assert "error: input: 'topic' is a required property" in err
    assert "--input KEY=VALUE" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("option", "text", "why"),
    [
        ("--input-json", '{"topic": "\\ud800"}', "lone surrogate"),
        ("--input", 'topic="\\udfff"', "lone surrogate"),
        ("--input-json", "[" * 20000 + "]" * 20000, "nested too deeply"),
    ],
)
def test_input_the_run_state_could_not_hold_is_refused_with_exit_2(
    tmp_path: Path, option: str, text: str, why: str
) -> None:
    code, out, err = invoke("run", str(RESEARCH), option, text, "--state-dir", str(tmp_path / "r"))
    assert code == 2 and out == ""
    assert why in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


# --- exit codes -----------------------------------------------------------------------------


def test_an_unexpected_exception_exits_70_in_one_line_never_1_and_ctrl_c_130() -> None:
    @click.group(cls=group.Group)
    def tool() -> None:
        """A group like agentflows'."""

    @tool.command()
    def crash() -> None:
        raise TypeError("unsupported operand")

    @tool.command()
    def interrupt() -> None:
        raise KeyboardInterrupt

    crashed = CliRunner().invoke(tool, ["crash"])
    assert crashed.exit_code == 70
    assert crashed.stderr.startswith("internal error: TypeError: unsupported operand (a bug")
    assert "Traceback" not in crashed.stderr
    interrupted = CliRunner().invoke(tool, ["interrupt"])
    assert interrupted.exit_code == 130 and "Aborted" not in interrupted.stderr


HOLD_FLOW = """
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: held}
spec:
  nodes:
    - {id: first, transform: '="first"'}
    - id: hold
      tool:
        python:
          script: |
            import json, os, sys, time
            args = json.load(sys.stdin)
            while not os.path.exists(args["release"]):
                time.sleep(0.05)
            print(json.dumps({"released": True}))
          timeoutSeconds: 300
        args: {release: RELEASE}
    - {id: last, transform: '={first: .nodes.first.json, hold: .nodes.hold.json}'}
"""


def _wait_for_node(state_file: Path, node: str, phase: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # read as `agentflows get` does: the state file and the journal of saves beside it
        record = store.FileStore(state_file).read().nodes.get(node)
        if record is not None and record.phase == phase:
            return
        time.sleep(0.05)
    raise AssertionError(f"node {node} never reached {phase}")


def test_ctrl_c_exits_130_saves_the_run_and_resume_skips_finished_nodes(
    tmp_path: Path, tool_dir: Path
) -> None:
    release = tool_dir / "release"
    flow = tmp_path / "held.yaml"
    flow.write_text(HOLD_FLOW.replace("RELEASE", json.dumps(str(release))))
    state = tmp_path / "runs"
    running = subprocess.Popen(
        [AGENTFLOWS, "run", str(flow), "--name", "held-1", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
        # As a shell starts a foreground job: a test run in the background (CI started with
        # `&` by a non-interactive shell) inherits SIGINT ignored, and Python then never
        # raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for_node(state / "held-1.json", "hold", "Running")
        os.killpg(running.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert running.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err
    assert f"continue it with: agentflows resume held-1 --state-dir {state}" in err
    saved = json.loads(out)
    assert (saved["phase"], saved["reason"]) == ("Pending", "Interrupted")
    assert saved["nodes"]["first"]["phase"] == "Succeeded"

    listed = agentflows("list", "--state-dir", str(state), cwd=tmp_path)
    assert listed.stdout.splitlines()[1].split()[:4] == ["held-1", "held", "Pending", "hold"]

    release.touch()
    resumed = agentflows("resume", "held-1", "--state-dir", str(state), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    done = json.loads(resumed.stdout)
    assert done["phase"] == "Succeeded"
    assert done["output"] == {"first": "first", "hold": {"released": True}}
    assert done["nodes"]["hold"]["attempts"] == 2  # interrupted once, run again
    assert "… first" not in resumed.stderr  # the finished node did not start again


def test_an_interrupted_run_is_saved_pending_with_the_interrupted_run_reason(
    tmp_path: Path,
) -> None:
    # Reasons are one enum next to RunPhase (issue 10): Ctrl-C's is one of them too.
    local_runs.save_interrupted(tmp_path, "held-1")
    outcome = store.FileStore(local.state_path(tmp_path, "held-1")).read().outcome
    assert outcome is not None
    assert outcome.phase == flowrun_api.RunPhase.PENDING
    assert outcome.reason == flowrun_api.RunReason.INTERRUPTED == "Interrupted"


# --- resume hints ---------------------------------------------------------------------------


def test_the_printed_resume_commands_run_as_printed_in_a_shell(tmp_path: Path) -> None:
    state = tmp_path / "my runs"  # a space: the commands must be quoted
    started = agentflows(
        "run", str(RESEARCH), "--input", "topic=kopf", "--state-dir", str(state), cwd=tmp_path
    )
    assert started.returncode == 3, started.stderr
    name = json.loads(started.stdout)["name"]
    hints = {
        line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
        for line in started.stderr.splitlines()
        if line.startswith("  approve:") or line.startswith("  reject:")
    }
    assert hints["reject"] == (
        f"agentflows resume {name} --request review --state-dir '{state}' --decision reject"
    )
    assert "|" not in started.stderr
    pasted = subprocess.run(
        hints["reject"],
        shell=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        timeout=120,
        check=False,
    )
    assert pasted.returncode == 0, pasted.stderr
    done = json.loads(pasted.stdout)
    assert done["requests"]["review"]["decision"] == "reject"
    assert done["output"] == {"topic": "kopf", "published": False}


def test_an_input_request_hint_carries_data_shaped_by_its_schema(tmp_path: Path) -> None:
    code, _, err = invoke(
        "run", str(ONBOARDING), "--input", "team=x", "--state-dir", str(tmp_path), "--name", "o"
    )
    assert code == 3
    respond = next(line for line in err.splitlines() if line.startswith("  respond:"))
    command = respond.split(":", 1)[1].strip()
    assert command.startswith("agentflows resume o --request ")
    data = json.loads(command.split("--data ", 1)[1].strip("'"))
    assert set(data) == {"owner", "slack"}
    assert "--decision approve" not in err  # an input request takes data or a rejection
    assert any(line.startswith("  reject:") for line in err.splitlines())


def test_resume_refuses_a_decision_the_request_kind_does_not_take(tmp_path: Path) -> None:
    code, _, _ = invoke(
        "run", str(ONBOARDING), "--input", "team=x", "--state-dir", str(tmp_path), "--name", "o"
    )
    assert code == 3
    code, out, err = invoke("resume", "o", "--state-dir", str(tmp_path), "--decision", "approve")
    assert code == 2 and out == ""
    assert "decision 'approve' is not valid for an input request" in err
    assert "(valid: reject, respond)" in err


# --- list, get and requests of local runs -------------------------------------------------


def _waiting_research(state: Path, name: str = "r1") -> None:
    code, _, _ = invoke(
        "run", str(RESEARCH), "--input", "topic=kopf", "--state-dir", str(state), "--name", name
    )
    assert code == 3


def test_list_shows_local_runs_with_the_columns_of_kubectl_get_flowruns(tmp_path: Path) -> None:
    _waiting_research(tmp_path)
    code, out, _ = invoke("list", "--state-dir", str(tmp_path))
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == [
        "NAME", "FLOW", "PHASE", "NODE", "ATTEMPT", "DURATION", "TRIGGER", "AGE"
    ]  # fmt: skip
    assert row.split()[:3] == ["r1", "research", "Waiting"]
    assert row.split()[6] == "manual"
    code, out, _ = invoke("list", "--state-dir", str(tmp_path), "-o", "wide")
    assert out.splitlines()[0].split()[-3:] == ["REASON", "REQUESTS", "MESSAGE"]
    assert 'waiting for request "review"' in out.splitlines()[1]
    code, out, _ = invoke("list", "--state-dir", str(tmp_path), "-o", "name")
    assert out == "r1\n"


def test_get_prints_the_same_summary_as_run_in_every_format(tmp_path: Path) -> None:
    code, printed, _ = invoke(
        "run", str(RESEARCH), "--input", "topic=kopf", "--state-dir", str(tmp_path), "--name", "r1"
    )
    assert code == 3
    code, as_json, _ = invoke("get", "r1", "--state-dir", str(tmp_path), "-o", "json")
    assert code == 0 and json.loads(as_json) == json.loads(printed)
    info = json.loads(as_json)
    assert set(info) == {
        "name", "namespace", "flow", "phase", "reason", "message", "attempt", "startTime",
        "completionTime", "output", "usage", "nodes", "requests",
    }  # fmt: skip
    code, as_yaml, _ = invoke("get", "r1", "--state-dir", str(tmp_path), "-o", "yaml")
    assert yaml.safe_load(as_yaml) == info
    code, table, _ = invoke("get", "r1", "--state-dir", str(tmp_path))
    assert table.splitlines()[0] == "r1  flow research  phase Waiting"
    assert "request review (approval): Publish findings on kopf? [pending]" in table
    code, wide, _ = invoke("get", "r1", "--state-dir", str(tmp_path), "-o", "wide")
    assert "approvers group:editors" in wide
    code, name, _ = invoke("get", "r1", "--state-dir", str(tmp_path), "-o", "name")
    assert name == "r1\n"


def test_get_of_an_unknown_local_run_exits_2(tmp_path: Path) -> None:
    code, out, err = invoke("get", "nope", "--local", "--state-dir", str(tmp_path))
    assert code == 2 and out == ""
    assert f"error: no local run nope in {tmp_path}" in err


def test_without_options_list_and_get_look_at_the_state_directory_of_the_cwd(
    tmp_path: Path,
) -> None:
    started = agentflows(
        "run", str(RESEARCH), "--input", "topic=kopf", "--name", "r1", "-q", cwd=tmp_path
    )
    assert started.returncode == 3
    env = {"KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    listed = agentflows("list", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:3] == ["r1", "research", "Waiting"]
    got = agentflows("get", "r1", "-o", "name", cwd=tmp_path, env=env)
    assert got.stdout == "r1\n"
    pending = agentflows("requests", "-o", "name", cwd=tmp_path, env=env)
    assert pending.stdout == "r1 review\n"
    elsewhere = agentflows("get", "r2", cwd=tmp_path, env=env)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr == (
        "error: no local run r2 in .agentflows/runs, and no kubeconfig: "
        "set KUBECONFIG or --kubeconfig\n"
    )
    both = agentflows("list", "--local", "-n", "default", cwd=tmp_path, env=env)
    assert both.returncode == 2 and "name different places" in both.stderr


def test_requests_lists_pending_requests_of_local_runs_in_every_format(tmp_path: Path) -> None:
    _waiting_research(tmp_path, "r1")
    code, out, _ = invoke("requests", "--state-dir", str(tmp_path))
    header, row = out.splitlines()
    assert header.split() == ["FLOW", "RUN", "REQUEST", "KIND", "MESSAGE", "SUMMARY", "AGE"]
    assert row.split()[:4] == ["research", "r1", "review", "approval"]
    code, out, _ = invoke("requests", "--state-dir", str(tmp_path), "-o", "json")
    (item,) = json.loads(out)
    assert (item["run"], item["request"], item["kind"]) == ("r1", "review", "approval")
    code, out, _ = invoke("requests", "--state-dir", str(tmp_path), "-o", "wide")
    assert code == 0
    assert out.splitlines()[0].split()[-3:] == ["NODE", "APPROVERS", "EXPIRES"]


# --- help and completion --------------------------------------------------------------------


def test_help_separates_user_commands_from_internal_ones_and_h_works() -> None:
    code, out, _ = invoke("-h")
    assert code == 0
    internal = out.index("Internal (run by the operator's pods, CronJobs and Deployments):")
    for command in ("operator", "runner", "trigger", "webhook"):
        assert out.index(f"\n  {command} ") > internal
    for command in ("run", "resume", "list", "get", "approve"):
        assert out.index(f"\n  {command} ") < internal
    code, out, _ = invoke("get", "-h")
    assert code == 0 and "-o, --output [table|wide|json|yaml|name]" in out


def test_reject_and_respond_show_only_their_own_options() -> None:
    _, reject, _ = invoke("reject", "--help")
    assert "--edits" not in reject and "--data" not in reject and "--all" in reject
    _, respond, _ = invoke("respond", "--help")
    assert "--data" in respond
    assert "--edits" not in respond and "--all" not in respond and "--flow" not in respond
    _, approve, _ = invoke("approve", "--help")
    assert "--edits" in approve and "--data" not in approve


def test_the_shell_completes_local_run_names(tmp_path: Path) -> None:
    state = tmp_path / ".agentflows" / "runs"
    _waiting_research(state, "research-one")
    _waiting_research(state, "research-two")
    done = agentflows(
        cwd=tmp_path,
        env={
            "_AGENTFLOWS_COMPLETE": "bash_complete",
            "COMP_WORDS": "agentflows resume research-t",
            "COMP_CWORD": "2",
        },
    )
    assert done.stdout.splitlines() == ["plain,research-two"], done.stderr


def test_list_warns_about_an_unreadable_run_and_still_lists_the_others(tmp_path: Path) -> None:
    _waiting_research(tmp_path, "r1")
    (tmp_path / "broken.snapshot.json").write_text("{not json")
    code, out, err = invoke("list", "--state-dir", str(tmp_path), "-o", "name")
    assert code == 0 and out == "r1\n"
    snapshot = tmp_path / "broken.snapshot.json"
    assert err.startswith(f"warning: cannot read run broken: {snapshot}: not a run snapshot: ")
    code, out, err = invoke("get", "broken", "--state-dir", str(tmp_path))
    assert code == 2 and f"{snapshot}: not a run snapshot: " in err, err
