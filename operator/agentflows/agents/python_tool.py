"""The ``python`` tool: a script run in a subprocess, JSON arguments in, JSON result out.

Used through :class:`agentflows.agents.spec_tools.SpecToolProvider` and by ``tool`` nodes, and for
skills' scripts (:class:`agentflows.agents.spec_tools.SkillToolProvider`). The script is written
to a fresh temporary directory, which is also its working directory, and run with the operator's
own interpreter (``sys.executable``). It reads the arguments as JSON on stdin and prints its
result on stdout: JSON is parsed, any other text is returned as a string, and no output is null.

The script is contained (:mod:`agentflows.agents.containment`): a scrubbed environment (no
provider keys, no ``KUBECONFIG``, no ``AGENTFLOWS_SECRET_*``: secrets reach only the fields that
reference them), memory, CPU-time, file-size and process limits (:data:`LIMITS`, CPU time
following the tool's timeout), and a launcher that owns the whole process tree. Running past the
timeout kills that tree, grandchildren that left the session included; output beyond
:data:`MAX_OUTPUT_BYTES` kills it too, so a runaway script cannot exhaust the runner's memory.
Killing never waits for the pipes' end longer than :data:`_REAP_SECONDS`.

A nonzero exit is an error for the model with the end of stderr, saying which limit was hit when
one was (the container's memory limit too: an OOM kill says "ran out of memory"). The result and
the error pass through the run's redactor, so a script that prints a secret value it found
somewhere shows ``[redacted]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from agentflows.agents import containment, secrets, tools

#: Largest stdout accepted from a script.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
#: How much of stderr an error quotes (the end, where the traceback's cause is).
MAX_STDERR_CHARS = 2000
_READ_CHUNK = 65536
#: How long a killed script's launcher, pipes and exit are waited for.
_REAP_SECONDS = 5.0
_POLL_SECONDS = 0.01
#: Limits of every script; ``cpu_seconds`` is replaced by the tool's timeout, rounded up.
LIMITS = containment.Limits()
#: File name of the script in its working directory.
SCRIPT_NAME = "tool.py"


class PythonToolRunner:
    """One python tool; :meth:`run` runs the script once."""

    def __init__(
        self,
        name: str,
        script: str,
        timeout_seconds: float,
        env: Mapping[str, str],
        redactor: secrets.Redactor,
    ) -> None:
        self.name = name
        self.script = script
        self.timeout_seconds = timeout_seconds
        self._env = containment.scrubbed_env(env)
        self._redactor = redactor
        self._limits = dataclasses.replace(LIMITS, cpu_seconds=math.ceil(timeout_seconds) + 1)

    async def run(self, args: Any) -> tools.ToolOutcome:
        """Run the script with ``args`` on stdin: its result, or an error for the model."""
        # Made before the first await: a call cancelled there (Ctrl-C, a runner's SIGTERM)
        # would leave a directory made in a thread behind. A few bytes to a new file, once.
        workdir = self._prepare()
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
        argv = containment.command(
            [sys.executable, os.path.join(workdir, SCRIPT_NAME)], self._limits, scratch=workdir
        )
        oom_kills = containment.oom_kills()
        creating = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=workdir,
                env=self._env,
                # Its own session and process group, led by the containment launcher.
                start_new_session=True,
            )
        )
        try:
            process = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # Cancelled while starting (Ctrl-C): asyncio would SIGKILL the launcher alone and
            # then wait for pipes its script still holds. Let the start finish and kill the
            # whole tree the usual way.
            await _kill(await creating)
            raise
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
        return self._outcome(process.returncode, stdout, stderr, oom_kills)

    def _outcome(
        self, returncode: int | None, stdout: bytes, stderr: bytes, oom_kills: int | None
    ) -> tools.ToolOutcome:
        if returncode != 0:
            tail = stderr.decode("utf-8", errors="replace").strip()[-MAX_STDERR_CHARS:]
            reason = containment.exit_reason(returncode, self._limits) or containment.oom_killed(
                returncode, oom_kills
            )
            if reason is None and tail.rpartition("\n")[2].startswith("MemoryError"):
                reason = (
                    f"ran out of memory (limit {self._limits.memory_bytes // containment.MIB} MiB)"
                )
            what = f"{reason}; exited" if reason else "exited"
            return tools.ToolOutcome.failure(
                self._redactor(
                    f"{self.name}: {what} with status {returncode}" + (f": {tail}" if tail else "")
                )
            )
        text = stdout.decode("utf-8", errors="replace").strip()
        if not text:
            return tools.ToolOutcome.success(None)
        try:
            # Parsed first: a secret written with JSON escapes is masked in its decoded form.
            return tools.ToolOutcome.success(self._redactor.value(json.loads(text)))
        except ValueError:
            return tools.ToolOutcome.success(self._redactor(text))


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
    """Kill the script and its whole tree, and reap it, each wait bounded.

    The launcher gets SIGTERM first: it SIGKILLs every descendant, those that left the process
    group included, and exits. Then the group gets SIGKILL, for a launcher that did not. The
    pipes are read to their end (a reader paused on a full buffer would never see it) but not
    waited for beyond :data:`_REAP_SECONDS`: a survivor could hold them open forever.
    """
    if process.returncode is None:
        containment.stop(process.pid)
        await _exited(process, _REAP_SECONDS)
    containment.kill_group(process.pid)
    if process.stdin is not None:
        process.stdin.close()
    streams = [s for s in (process.stdout, process.stderr) if s is not None]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*map(_discard, streams)), _REAP_SECONDS)
    await _exited(process, _REAP_SECONDS)


async def _exited(process: asyncio.subprocess.Process, seconds: float) -> None:
    """Wait for the exit itself: ``process.wait()`` would also wait for the pipes' end."""
    deadline = asyncio.get_running_loop().time() + seconds
    # Polled: asyncio offers no event for the exit alone, only for exit and pipes closed.
    while process.returncode is None and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_SECONDS)


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(_READ_CHUNK):
        pass
