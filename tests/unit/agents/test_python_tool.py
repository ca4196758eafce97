"""The python tool: JSON in on stdin, JSON out on stdout, errors and timeouts."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities
from tests.support.processes import survivors


async def call(
    ctx: capabilities.NodeContext,
    script: str,
    args: Any = None,
    env: dict[str, str] | None = None,
    timeout_seconds: float = 10,
) -> capabilities.NodeResult:
    tool = agent_api.Tool(
        name="script", python=agent_api.PythonTool(script=script, timeout_seconds=timeout_seconds)
    )
    caps = host.LiveCapabilities(env=env if env is not None else {"PATH": "/usr/bin:/bin"})
    result = await caps.call_tool(capabilities.ToolTask(tool, "script", args), ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


async def test_script_reads_json_arguments_and_prints_a_json_result(
    ctx: capabilities.NodeContext,
) -> None:
    script = "import json, sys\nargs = json.load(sys.stdin)\nprint(json.dumps([args['x'] * 2]))"
    result = await call(ctx, script, {"x": 21})
    assert result.output["json"] == [42]
    assert result.usage.tool_calls == 1


async def test_non_json_output_is_returned_as_text(ctx: capabilities.NodeContext) -> None:
    result = await call(ctx, "print('hello there')")
    assert result.output["json"] == "hello there"


async def test_nonzero_exit_fails_with_the_end_of_stderr(ctx: capabilities.NodeContext) -> None:
    with pytest.raises(
        capabilities.CapabilityError, match=r"(?s)exited with status 1.*ZeroDivisionError"
    ):
        await call(ctx, "1 / 0")


def _sleeper(marker: str, tool_dir: Path) -> str:
    """Script lines: a child sleeping 30 s (``marker`` in its command line), then ``slept``."""
    return (
        "import os, subprocess, sys\n"
        "os.umask(0)\n"
        f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)  # {marker}'])\n"
        f"open({str(tool_dir / 'slept')!r}, 'w').close()\n"
    )


async def gone(marker: str) -> None:
    """Wait until no process with ``marker`` is left (it was killed: it would sleep 30 s)."""
    for _ in range(200):
        if not survivors(marker):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"processes with {marker} are still there: {survivors(marker)}")


async def test_script_running_past_its_timeout_is_killed(
    ctx: capabilities.NodeContext, tool_dir: Path
) -> None:
    marker = f"timeout-{uuid.uuid4().hex}"
    with pytest.raises(
        capabilities.CapabilityError, match=r"killed after timeoutSeconds=0\.5"
    ) as failure:
        await call(ctx, _sleeper(marker, tool_dir), timeout_seconds=0.5)
    assert failure.value.retryable
    await gone(marker)
    assert not (tool_dir / "slept").exists()  # killed, not left to sleep its 30 s


async def test_script_sees_only_the_basic_environment(ctx: capabilities.NodeContext) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "AGENTFLOWS_SECRET_X_Y": "hunter22",
        "PLAIN": "not declared",
    }
    script = (
        f"import json, os\nprint(json.dumps(sorted(k for k in os.environ if k in {sorted(env)!r})))"
    )
    result = await call(ctx, script, env=env)
    assert result.output["json"] == ["LANG", "PATH"]


async def test_script_printing_without_end_is_killed(ctx: capabilities.NodeContext) -> None:
    with pytest.raises(capabilities.CapabilityError, match="printed more than"):
        await call(ctx, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")


async def test_timeout_also_kills_what_the_script_started(
    ctx: capabilities.NodeContext, tool_dir: Path
) -> None:
    marker = f"child-{uuid.uuid4().hex}"
    slept = tool_dir / "slept"
    child = f"import time; time.sleep(30); open({str(slept)!r}, 'w').close()  # {marker}"
    script = (
        "import os, subprocess, sys, time\n"
        "os.umask(0)\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print('x' * 300000, flush=True)\n"
        "time.sleep(30)\n"
    )
    with pytest.raises(capabilities.CapabilityError, match="killed after"):
        await call(ctx, script, timeout_seconds=1)
    # the child that holds the script's pipe was killed with it, before its 30 s sleep ended:
    # the call did not wait for the pipe to close
    await gone(marker)
    assert not slept.exists()


async def test_a_call_cancelled_at_any_step_leaves_no_scratch_directory_and_no_process(
    ctx: capabilities.NodeContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C (or a SIGTERM of the runner) cancels the call wherever it is; the first steps
    # were where a directory was made in a thread and the cancelled await forgot it.
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch_root))
    marker = f"held-{uuid.uuid4().hex}"
    script = f"import time\ntime.sleep(30)  # {marker}\n"
    for steps in range(12):
        call_task = asyncio.ensure_future(call(ctx, script))
        for _ in range(steps):
            await asyncio.sleep(0)
        call_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call_task
        assert list(scratch_root.iterdir()) == [], f"cancelled after {steps} steps"
    await gone(marker)
