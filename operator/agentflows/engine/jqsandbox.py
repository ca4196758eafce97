"""Bounded jq evaluation: a small pool of worker processes with time and memory limits.

Called by :mod:`agentflows.engine.expressions` for every program that
:func:`agentflows.engine.jqcheck.is_cheap` cannot prove cheap (and for cheap ones over a large
input). jq runs in C through the ``jq`` binding and cannot be interrupted from Python, so a
program that loops or allocates without end can only be bounded from outside its process:

- each worker is ``python -I`` running :data:`_WORKER` with an **empty environment** (no
  Secrets, no kubeconfig, even if a check upstream missed a way to read them), ``/`` as its
  directory, its own session (a terminal's Ctrl-C is the caller's to handle), stderr discarded,
  no file writes or child processes (``RLIMIT_FSIZE``, ``RLIMIT_NPROC``), ``RLIMIT_AS`` set to
  :data:`MEMORY_LIMIT_BYTES` and, before each evaluation, ``RLIMIT_CPU`` set to the time it has
  left (so a worker whose caller died still stops);
- the caller waits for the answer until the deadline, then kills the worker (SIGKILL) and
  raises :class:`Exceeded`; the next evaluation starts a fresh worker. A worker that dies on its
  own ran out of memory (jq aborts when an allocation fails) or CPU time;
- at most :data:`POOL_SIZE` workers exist per process, started on first use; a caller waits for
  a free one, and that wait counts against its deadline;
- results above :data:`MAX_RESULT_BYTES` of JSON are refused in the worker, so a caller never
  parses an unbounded answer.

:func:`evaluate` blocks its thread for at most the deadline; code on an event loop calls it in
a thread (:func:`agentflows.engine.expressions.evaluate_async`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

from agentflows.api import errors

POOL_SIZE = 2
MEMORY_LIMIT_BYTES = 512 * 1024 * 1024
MAX_RESULT_BYTES = 16 * 1024 * 1024
_MIB = 1024 * 1024

_OK, _JQ_ERROR, _NO_MEMORY, _TOO_LARGE = 0, 1, 2, 3
_EVALUATE, _COMPILE = 0, 1
_REQUEST = struct.Struct("!BIId")
_REPLY = struct.Struct("!BI")

#: The worker program. It imports nothing of agentflows: it runs with an empty environment.
_WORKER = r"""
import json, resource, struct, sys
memory, max_result = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
import jq
read, write = sys.stdin.buffer.read, sys.stdout.buffer
request, reply = struct.Struct("!BIId"), struct.Struct("!BI")
programs = {}
write.write(b"R")
write.flush()
while True:
    head = read(request.size)
    if len(head) < request.size:
        break
    mode, source_size, input_size, seconds = request.unpack(head)
    source = read(source_size).decode(errors="surrogatepass")
    text = read(input_size).decode(errors="surrogatepass")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    budget = int(usage.ru_utime + usage.ru_stime + seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (budget, resource.RLIM_INFINITY))
    try:
        if mode == 1:  # compile only: jq folds constants ("x" * 1e9) as it compiles
            jq.compile(source)
            body = b"[]"
        else:
            program = programs.get(source)
            if program is None:
                if len(programs) >= 256:
                    programs.clear()
                program = programs[source] = jq.compile(source)
            body = json.dumps(program.input_text(text).all(), ensure_ascii=False).encode()
        status = 0 if len(body) <= max_result else 3
    except MemoryError:
        status, body = 2, b""
    except ValueError as exc:
        status, body = 1, str(exc).encode()
    if status >= 2:
        body = b""
    write.write(reply.pack(status, len(body)) + body)
    write.flush()
"""


#: How long a new worker may take to start (import jq, set its limits) before it is given up.
_START_SECONDS = 30.0


class Exceeded(errors.AgentflowsError):
    """An evaluation hit a bound (time, memory, result size); the message says which."""


class Busy(Exceeded):
    """The deadline passed while every worker was busy with other evaluations."""

    retryable = True


class EvaluationError(errors.AgentflowsError):
    """jq reported an error for this program and input (its message, as jq wrote it)."""


class _Worker:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER, str(MEMORY_LIMIT_BYTES), str(MAX_RESULT_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
            cwd="/",
            close_fds=True,
            start_new_session=True,
        )
        # Starting an interpreter is not the expression's time: wait for the worker to be ready
        # (a slow start on a loaded machine would otherwise be blamed on the first program).
        try:
            ready = self.read(1, time.monotonic() + _START_SECONDS)
        except TimeoutError:
            self.kill()
            raise
        if ready != b"R":
            self.kill()
            raise TimeoutError

    @property
    def stdin(self) -> IO[bytes]:
        assert self.process.stdin is not None
        return self.process.stdin

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def read(self, size: int, deadline: float) -> bytes:
        """``size`` bytes of the reply; b"" short when the worker died; TimeoutError at deadline."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        chunks: list[bytes] = []
        missing = size
        while missing:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(missing, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)


class _Pool:
    """Idle workers and a count of all of them; a condition hands them out."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0
        self._pid = os.getpid()

    def acquire(self, deadline: float) -> _Worker:
        with self._condition:
            if self._pid != os.getpid():  # a forked child must not share its parent's pipes
                self._idle, self._count, self._pid = [], 0, os.getpid()
            while not self._idle and self._count >= POOL_SIZE:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self._condition.wait(remaining)
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker()
        except BaseException:
            self.discard(None)
            raise

    def release(self, worker: _Worker) -> None:
        with self._condition:
            self._idle.append(worker)
            self._condition.notify()

    def discard(self, worker: _Worker | None) -> None:
        if worker is not None:
            worker.kill()
        with self._condition:
            self._count -= 1
            self._condition.notify()

    def close(self) -> None:
        with self._condition:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for worker in idle:
            worker.kill()


_POOL = _Pool()
atexit.register(_POOL.close)


def evaluate(source: str, text: str, seconds: float) -> list[Any]:
    """Every output of jq ``source`` over the JSON ``text``, within ``seconds`` and the limits.

    Raises :class:`Exceeded` at a bound and :class:`EvaluationError` for jq's own errors.
    """
    return _request(_EVALUATE, source, text, seconds)


def check(source: str, seconds: float) -> None:
    """Compile jq ``source`` in a worker, within ``seconds`` and the limits; run nothing.

    jq folds constant expressions while it compiles (``"x" * 2e9`` is a 2 GB string before
    anything runs), so a program that is not provably cheap is compiled here, never in the
    caller's process. Raises :class:`EvaluationError` with jq's message for a program jq
    refuses, :class:`Exceeded` at a bound.
    """
    _request(_COMPILE, source, "", seconds)


def _request(mode: int, source: str, text: str, seconds: float) -> list[Any]:
    # A worker that died while idle (killed from outside) gets one fresh worker for the
    # request; one that dies on it twice was killed by the request (its memory limit).
    for tries_left in (1, 0):
        try:
            worker = _POOL.acquire(time.monotonic() + seconds)
        except TimeoutError:
            raise Busy(f"expression waited {_seconds(seconds)} s for a free evaluator") from None
        # The program's own time starts once it has a worker: time spent waiting for one
        # (other programs held them all) is reported as Busy, never blamed on this program.
        try:
            return _exchange(worker, mode, source, text, seconds, time.monotonic() + seconds)
        except _Gone:
            if not tries_left:
                raise Exceeded(_memory_message()) from None
    raise AssertionError("unreachable")


class _Gone(Exception):
    """The worker was gone before it read the request."""


def _seconds(seconds: float) -> str:
    """A bound as people write it: 2, 0.5, 172800 (not 1.99998)."""
    rounded = round(seconds, 1)
    return f"{rounded:g}" if rounded else f"{seconds:.2g}"


def _memory_message() -> str:
    return f"expression exceeded its memory limit ({MEMORY_LIMIT_BYTES // _MIB} MiB)"


def _exchange(
    worker: _Worker, mode: int, source: str, text: str, seconds: float, deadline: float
) -> list[Any]:
    encoded_source = source.encode(errors="surrogatepass")
    encoded_text = text.encode(errors="surrogatepass")
    head = _REQUEST.pack(mode, len(encoded_source), len(encoded_text), seconds)
    try:
        worker.stdin.write(head + encoded_source + encoded_text)
        worker.stdin.flush()
        reply = worker.read(_REPLY.size, deadline)
        status, size = _REPLY.unpack(reply) if len(reply) == _REPLY.size else (_NO_MEMORY, 0)
        body = worker.read(size, deadline) if size else b""
    except BrokenPipeError:
        _POOL.discard(worker)
        raise _Gone from None
    except TimeoutError:
        _POOL.discard(worker)
        raise Exceeded(f"expression exceeded {_seconds(seconds)} s") from None
    except BaseException:  # interrupted (Ctrl-C): the worker may still be busy; never reuse it
        _POOL.discard(worker)
        raise
    if len(reply) < _REPLY.size or len(body) < size:
        _POOL.discard(worker)  # it died: reaped here, so its exit status says why
        if worker.process.returncode == -signal.SIGXCPU:
            raise Exceeded(f"expression exceeded {_seconds(seconds)} s")
        raise Exceeded(_memory_message())
    _POOL.release(worker)
    if status == _OK:
        values: list[Any] = json.loads(body)
        return values
    if status == _JQ_ERROR:
        raise EvaluationError(body.decode(errors="replace"))
    if status == _TOO_LARGE:
        raise Exceeded(f"expression's result exceeded {MAX_RESULT_BYTES // _MIB} MiB")
    raise Exceeded(_memory_message())
