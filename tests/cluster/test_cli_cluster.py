"""The ``agentflows`` cluster commands (start, get, list, watch, logs) against the operator.

Each command runs as a subprocess with the admin kubeconfig, as a user would type it; the
operator runs as in ``test_operator.py``. ``kubectl get flowruns`` is checked for the printer
columns of the CRD.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.kube_fixtures import grant
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import PIECES, FlowRuns, python_tool, start_told
from tests.support.model_server import ScriptedModelServer
from tests.support.processes import Reading

pytestmark = pytest.mark.cluster


SHOUT = """
import json, sys
args = json.load(sys.stdin)
print(json.dumps({"text": args["text"].upper()}))
"""

HOLD = """
import json, os, sys, time
args = json.load(sys.stdin)
deadline = time.time() + 150
while not os.path.exists(args["release"]) and time.time() < deadline:
    time.sleep(0.1)
print(json.dumps({"released": os.path.exists(args["release"])}))
"""


def cli_argv(cluster: Cluster, namespace: str, *args: str, user: str = "admin") -> list[str]:
    """The command line of ``agentflows ARGS`` as ``user`` (default admin) in ``namespace``."""
    return [
        sys.executable, "-m", "agentflows.cli.main", *args,
        "-n", namespace, "--kubeconfig", str(cluster.kubeconfig(user)),
    ]  # fmt: skip


def run_cli(cluster: Cluster, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_argv(cluster, namespace, *args),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def shout_flow() -> dict[str, Any]:
    return {
        "kind": "Flow",
        "metadata": {"name": "shout"},
        "spec": {
            "input": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
            "nodes": [
                {"id": "greet", "transform": '="hello " + .run.input.name'},
                {"id": "loud", "tool": python_tool(SHOUT, {"text": "=.nodes.greet.json"})},
            ],
            "output": "=.nodes.loud.json",
        },
    }


def held_flow(release: Path | str) -> dict[str, Any]:
    return {
        "kind": "Flow",
        "metadata": {"name": "held"},
        "spec": {
            "nodes": [
                {"id": "first", "transform": "=1"},
                {"id": "hold", "tool": python_tool(HOLD, {"release": str(release)}, timeout=200)},
                {"id": "last", "transform": "={released: .nodes.hold.json.released}"},
            ],
            "output": "=.nodes.last.json",
        },
    }


def test_start_with_wait_prints_the_run_name_and_the_final_json(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    runs.apply(shout_flow())
    wait_for(
        lambda: (c := runs.condition("flows", "shout", "Ready")) and c["status"] == "True",
        60,
        "Flow Ready",
    )
    done = run_cli(control_plane, runs.namespace, "start", "shout", "--input", "name=ada", "--wait")
    assert done.returncode == 0, done.stderr
    name, _, rest = done.stdout.partition("\n")
    assert name.startswith("shout-")
    final = json.loads(rest)
    assert final["name"] == name
    assert final["phase"] == "Succeeded"
    assert final["output"] == {"text": "HELLO ADA"}
    assert {k: v["phase"] for k, v in final["nodes"].items()} == {
        "greet": "Succeeded",
        "loud": "Succeeded",
    }
    assert runs.run(name)["spec"]["trigger"] == {"type": "manual"}

    table = run_cli(control_plane, runs.namespace, "get", name)
    assert table.returncode == 0, table.stderr
    first, *rest_lines = table.stdout.splitlines()
    assert first.startswith(f"{runs.namespace}/{name}  flow shout  phase Succeeded  attempt 1")
    assert any(line.split()[:2] == ["Succeeded", "greet"] for line in rest_lines)
    assert any(line.split()[:2] == ["Succeeded", "loud"] for line in rest_lines)
    assert 'output: {"text": "HELLO ADA"}' in table.stdout

    as_json = run_cli(control_plane, runs.namespace, "get", name, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    info = json.loads(as_json.stdout)
    assert (info["flow"], info["phase"], info["attempt"]) == ("shout", "Succeeded", 1)
    assert info["output"] == {"text": "HELLO ADA"}
    assert info["nodes"]["loud"]["output"]["json"] == {"text": "HELLO ADA"}

    missing = run_cli(control_plane, runs.namespace, "get", "no-such-run")
    assert missing.returncode == 2 and "error:" in missing.stderr

    assert_every_output_format_of_a_cluster_run(control_plane, runs.namespace, name, info)


def assert_every_output_format_of_a_cluster_run(
    cluster: Cluster, namespace: str, name: str, info: dict[str, Any]
) -> None:
    """``get``/``list`` in each ``-o`` format, and run names completing in the shell."""
    as_yaml = run_cli(cluster, namespace, "get", name, "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout) == info
    assert run_cli(cluster, namespace, "get", name, "-o", "name").stdout == f"{name}\n"
    wide = run_cli(cluster, namespace, "get", name, "-o", "wide").stdout
    assert "  attempts 1  usage " in wide and "started 20" in wide

    listed = run_cli(cluster, namespace, "list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == [
        "NAME", "FLOW", "PHASE", "NODE", "ATTEMPT", "DURATION", "TRIGGER", "AGE"
    ]  # fmt: skip
    row = next(r.split() for r in rows if r.split()[0] == name)
    assert row[1:3] == ["shout", "Succeeded"] and row[4] == "1" and row[6] == "manual"
    wide_rows = run_cli(cluster, namespace, "list", "-o", "wide").stdout.splitlines()
    assert wide_rows[0].split()[-3:] == ["REASON", "REQUESTS", "MESSAGE"]
    assert name in run_cli(cluster, namespace, "list", "-o", "name").stdout.splitlines()
    (listed_info,) = [
        i
        for i in json.loads(run_cli(cluster, namespace, "list", "-o", "json").stdout)
        if i["name"] == name
    ]
    assert (listed_info["flow"], listed_info["phase"]) == ("shout", "Succeeded")
    everywhere = run_cli(cluster, namespace, "list", "-A", "--flow", "shout").stdout
    assert any(line.split()[:2] == [namespace, name] for line in everywhere.splitlines())

    completed = subprocess.run(
        [str(Path(sys.executable).parent / "agentflows")],
        env={
            **os.environ,
            "_AGENTFLOWS_COMPLETE": "bash_complete",
            "COMP_WORDS": f"agentflows watch -n {namespace} --kubeconfig "
            f"{cluster.kubeconfig()} {name[:7]}",
            "COMP_CWORD": "6",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"plain,{name}" in completed.stdout.splitlines(), completed.stderr


def test_watch_prints_node_lines_until_the_run_ends_and_logs_show_the_runner(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    # The tool runs in the runner's container (the real node): it is released by a file in the
    # container's /tmp, made with kubectl exec, since it cannot see the host's files.
    release = "/tmp/held-1.release"
    runs.apply(held_flow(release))
    started = run_cli(control_plane, runs.namespace, "start", "held", "--name", "held-1")
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "held-1"

    watcher = subprocess.Popen(
        cli_argv(control_plane, runs.namespace, "watch", "held-1", "--timeout", "200"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        runs.wait_node("held-1", "first", "Succeeded")
        # the phase is the operator's, from the pod it watches: it may follow the node's record
        wait_for(lambda: runs.status("held-1").get("phase") == "Running", 60, "phase Running")
        # kubectl shows the node being run once the runner wrote currentNode.
        row = wait_for(
            lambda: (
                (r := _kubectl_row(control_plane, runs.namespace, "held-1"))
                and r.get("NODE") == "hold"
                and r
            ),
            60,
            "kubectl's NODE column showing hold",
        )
        assert (row["FLOW"], row["PHASE"], row["ATTEMPT"]) == ("held", "Running", "1")
        pod = runs.status("held-1")["pod"]
        control_plane.kubectl(
            "exec", "-n", runs.namespace, pod, "-c", "runner", "--", "touch", release
        )
        out, err = watcher.communicate(timeout=200)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, err
    lines = out.splitlines()
    assert lines[-1] == "run held-1 Succeeded"
    node_lines = [line.split() for line in lines if line.startswith("  ")]
    assert ["Succeeded", "hold"] in node_lines
    assert ["Succeeded", "last"] in node_lines
    assert node_lines.index(["Succeeded", "hold"]) < node_lines.index(["Succeeded", "last"])
    assert runs.status("held-1")["output"] == {"released": True}  # released, not timed out

    logs = run_cli(control_plane, runs.namespace, "logs", "held-1")
    assert logs.returncode == 0, logs.stderr
    assert f"run {runs.namespace}/held-1 attempt 1" in logs.stdout
    assert any("node hold (tool)" in line for line in logs.stdout.splitlines())
    assert logs.stdout.rstrip().endswith("run Succeeded")

    row = _kubectl_row(control_plane, runs.namespace, "held-1")
    assert row is not None
    assert (row["FLOW"], row["PHASE"], row["ATTEMPT"]) == ("held", "Succeeded", "1")
    assert row["DURATION"] and row["DURATION"] != "<none>"
    assert row["TRIGGER"] == "manual"  # agentflows start makes a manual run


def _kubectl_row(cluster: Cluster, namespace: str, name: str) -> dict[str, str] | None:
    """One FlowRun's row of ``kubectl get flowruns``, keyed by the column headers."""
    text = cluster.kubectl("get", "flowruns", "-n", namespace).stdout
    header, *rows = text.splitlines()
    assert header.split() == [
        "NAME",
        "FLOW",
        "PHASE",
        "NODE",
        "ATTEMPT",
        "DURATION",
        "TRIGGER",
        "AGE",
    ]
    starts = [header.index(column) for column in header.split()]
    for row in rows:
        cells = [
            row[start:end].strip() for start, end in zip(starts, [*starts[1:], None], strict=True)
        ]
        if cells[0] == name:
            return dict(zip(header.split(), cells, strict=True))
    return None


def test_a_waiting_run_prints_decision_commands_that_work_when_pasted(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "asks"},
            "spec": {
                "nodes": [
                    {"id": "review", "approval": {"message": "Ship it?"}},
                    {"id": "done", "transform": "=.nodes.review.json.decision"},
                ],
            },
        }
    )
    waiting = run_cli(control_plane, runs.namespace, "start", "asks", "--wait", "-o", "name")
    assert waiting.returncode == 3, waiting.stderr
    name = waiting.stdout.splitlines()[0]
    lines = waiting.stderr.splitlines()
    assert lines[0] == f"run {name} waits for request 'review' (approval): Ship it?"
    commands = dict(line.strip().split(":", 1) for line in lines[1:])
    assert commands["approve"].strip() == f"agentflows approve {name} review -n {runs.namespace}"
    assert commands["reject"].strip() == f"agentflows reject {name} review -n {runs.namespace}"

    pasted = subprocess.run(
        commands["approve"],
        shell=True,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "KUBECONFIG": str(control_plane.kubeconfig()),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        timeout=120,
        check=False,
    )
    assert pasted.returncode == 0, pasted.stderr
    watched = run_cli(control_plane, runs.namespace, "watch", name, "--timeout", "200")
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.splitlines()[-1] == f"run {name} Succeeded"
    assert runs.status(name)["output"] == "approve"


def spoken(stderr: str, node: str) -> str:
    """What ``node`` said on ``watch --stream``'s stderr, its lines (``  node ▸ ...``) joined."""
    lead = f"  {node} ▸ "
    return "".join(line[len(lead) :] for line in stderr.splitlines() if line.startswith(lead))


RUN_READERS = [
    {"apiGroups": ["agentflows.io"], "resources": ["flowruns"], "verbs": ["get", "watch"]}
]
LOG_READERS = [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]


def test_watch_stream_shows_the_answer_while_the_model_writes_it_as_the_users_own_identity(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    grant(control_plane, runs.namespace, "run-readers", ("alice", "bob"), RUN_READERS)
    grant(control_plane, runs.namespace, "log-readers", ("alice",), LOG_READERS)
    start_told(runs, pod_model_server, "told-1")

    def watching(user: str) -> Reading:
        return Reading(
            cli_argv(control_plane, runs.namespace, "watch", "told-1", "--stream", user=user)
        )

    alice, bob = watching("alice"), watching("bob")
    try:
        wait_for(pod_model_server.holding.is_set, 180, "the model holding its answer")
        # alice sees the first three pieces while the model still holds the rest back
        wait_for(lambda: "Restart the api pod " in alice.text("stderr"), 60, "alice's live text")
        assert runs.status("told-1")["phase"] == "Running"
        assert "after" not in alice.text("stderr")
        wait_for(lambda: "live text not shown" in bob.text("stderr"), 60, "bob's refusal")
    finally:
        pod_model_server.release()
        alice_code, bob_code = alice.finish(120), bob.finish(120)

    assert alice_code == 0, alice.text("stderr")
    # a node line printed meanwhile on stdout breaks the text's line; its pieces stay in order
    assert spoken(alice.text("stderr"), "answer") == "".join(PIECES), alice.text("stderr")
    assert alice.text("stdout").splitlines()[-1] == "run told-1 Succeeded"
    # bob may follow the run but not read its pod's log: the API server says no, as bob
    assert bob_code == 0, bob.text("stderr")
    refusal = bob.text("stderr")
    assert '403 Forbidden: pods "told-1-1" is forbidden: User "bob"' in refusal, refusal
    assert "Restart" not in refusal
    assert bob.text("stdout").splitlines()[-1] == "run told-1 Succeeded"
    status = runs.status("told-1")
    assert status["output"] == "".join(PIECES)
    assert "stream" not in json.dumps(status)
