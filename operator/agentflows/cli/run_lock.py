"""One process at a time owns a local run: a lock file beside its state, held for the run's life.

``agentflows run`` and ``agentflows resume`` take ``<run>.lock`` (:func:`agentflows.cli.local.
lock_path`) with ``flock(LOCK_EX | LOCK_NB)`` before they write anything of the run, and hold it
until the process exits. Without it, a ``resume`` started while the run was still going ran the
current node a second time, concurrently, and both wrote the state file. The kernel drops the
lock when its process dies (SIGKILL included), so a killed run never leaves a stale lock; the
file itself stays (removing it would let two processes lock two different files of one name).
The descriptor is close-on-exec, so a tool the run starts never holds it.

The holder writes who it is into the file (pid, command line, since); a process that cannot
take the lock reads that and says who holds it (:class:`RunBusy`, exit 2). The local console
asks :func:`holder` before it starts ``agentflows resume``, and the child takes the lock
itself, so two clicks never run a run twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from agentflows.api import errors, times
from agentflows.cli import local


class RunBusy(errors.AgentflowsError):
    """Another process owns the run; the message says which and what to do."""

    retryable = True


def _busy_message(name: str, fd: int) -> str:
    try:
        who = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        who = {}
    if not isinstance(who, dict):
        who = {}
    return (
        f"run {name} is being run by another process: pid {who.get('pid', '?')} "
        f"({who.get('command', 'unknown command')}) since {who.get('since', '?')}; "
        "wait for it to stop (or stop it), then try again"
    )


@contextlib.contextmanager
def hold(directory: Path, name: str) -> Iterator[None]:
    """Own run ``name`` for the block; RunBusy when another process does."""
    path = local.lock_path(directory, name)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(_busy_message(name, fd)) from None
        since = times.timestamp()
        command = shlex.join(["agentflows", *sys.argv[1:]])
        record = json.dumps({"pid": os.getpid(), "command": command, "since": since})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        yield
    finally:
        os.close(fd)


def holder(directory: Path, name: str) -> str | None:
    """Who owns run ``name`` now, as :class:`RunBusy` says it (None: nobody)."""
    try:
        with hold(directory, name):
            return None
    except RunBusy as busy:
        return str(busy)
