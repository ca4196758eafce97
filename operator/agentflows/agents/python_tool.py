"""The ``python`` tool: a script run in a subprocess, JSON arguments in, JSON result out.

Used through :class:`agentflows.agents.spec_tools.SpecToolProvider` and by ``tool`` nodes (and
later by skills' scripts). The script is written to a fresh temporary directory, which is also its
working directory, and run with the operator's own interpreter (``sys.executable``). It reads
the arguments as JSON on stdin and prints its result on stdout: JSON is parsed, any other text
is returned as a string, and no output is null.

A nonzero exit is an error for the model with the end of stderr; running past the timeout kills
the process. Output beyond :data:`MAX_OUTPUT_BYTES` kills it too, so a runaway script cannot
exhaust the runner's memory. The script's environment is the host's minus the
``AGENTFLOWS_SECRET_*`` variables: secrets reach only the fields that reference them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from agentflows.agents import secrets, tools

#: Largest stdout accepted from a script.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
#: How much of stderr an error quotes (the end, where the traceback's cause is).
MAX_STDERR_CHARS = 2000
_READ_CHUNK = 65536
#: How long a killed script's pipes and exit are waited for.
_REAP_SECONDS = 5.0
#: File name of the script in its working directory.
SCRIPT_NAME = "tool.py"


class PythonToolRunner:
    """One python tool; :meth:`run` runs the script once."""

    def __init__(
        self, name: str, script: str, timeout_seconds: float, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.script = script
        self.timeout_seconds = timeout_seconds
        self._env = {k: v for k, v in env.items() if not k.startswith(secrets.ENV_PREFIX)}

    async def run(self, args: Any) -> tools.ToolOutcome:
        """Run the script with ``args`` on stdin: its result, or an error for the model."""
        workdir = await asyncio.to_thread(self._prepare)
        try:
            return await self._run_in(workdir, args)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _prepare(self) -> str:
        """Create the working directory holding the script; return its path."""
        workdir = tempfile.mkdtemp(prefix="agentflows-tool-")
        with open(os.path.join(workdir, SCRIPT_NAME), "w", encoding="utf-8") as handle:
            handle.write(self.script)
        return workdir

    async def _run_in(self, workdir: str, args: Any) -> tools.ToolOutcome:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            os.path.join(workdir, SCRIPT_NAME),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=self._env,
            # Its own process group, so a timeout kills what the script started too.
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(
                _communicate(process, json.dumps(args).encode()), self.timeout_seconds
            )
        except TimeoutError:
            await _kill(process)
            return tools.ToolOutcome.failure(
                f"{self.name}: killed after timeoutSeconds={self.timeout_seconds:g}",
                timeout=True,
            )
        except _OutputTooLarge:
            await _kill(process)
            return tools.ToolOutcome.failure(
                f"{self.name}: printed more than {MAX_OUTPUT_BYTES} bytes; killed"
            )
        except BaseException:
            await _kill(process)
            raise
        return _outcome(self.name, process.returncode, stdout, stderr)


class _OutputTooLarge(Exception):
    pass


async def _communicate(process: asyncio.subprocess.Process, data: bytes) -> tuple[bytes, bytes]:
    """Like ``communicate`` but refusing more than MAX_OUTPUT_BYTES on stdout or stderr."""
    assert process.stdin and process.stdout and process.stderr
    stdin = process.stdin

    async def feed() -> None:
        # A script that never reads stdin closes the pipe early; that is not an error.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(data)
            await stdin.drain()
        stdin.close()

    async def drain(stream: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await stream.read(_READ_CHUNK):
            size += len(chunk)
            if size > MAX_OUTPUT_BYTES:
                raise _OutputTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    stdout = asyncio.ensure_future(drain(process.stdout))
    stderr = asyncio.ensure_future(drain(process.stderr))
    tasks = [asyncio.ensure_future(feed()), stdout, stderr]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # Stop the readers before _kill reads the pipes itself (a stream has one reader).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    await process.wait()
    return stdout.result(), stderr.result()


async def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill the script and whatever it started, and reap it.

    The pipes are read to their end first: asyncio's ``wait()`` returns only once every pipe is
    closed, and a reader paused on a full buffer would never see the end.
    """
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    if process.stdin is not None:
        process.stdin.close()
    streams = [s for s in (process.stdout, process.stderr) if s is not None]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*map(_discard, streams)), _REAP_SECONDS)
        await asyncio.wait_for(process.wait(), _REAP_SECONDS)


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(_READ_CHUNK):
        pass


def _outcome(name: str, returncode: int | None, stdout: bytes, stderr: bytes) -> tools.ToolOutcome:
    if returncode != 0:
        tail = stderr.decode("utf-8", errors="replace").strip()[-MAX_STDERR_CHARS:]
        return tools.ToolOutcome.failure(
            f"{name}: exited with status {returncode}" + (f": {tail}" if tail else "")
        )
    text = stdout.decode("utf-8", errors="replace").strip()
    if not text:
        return tools.ToolOutcome.success(None)
    try:
        return tools.ToolOutcome.success(json.loads(text))
    except ValueError:
        return tools.ToolOutcome.success(text)
