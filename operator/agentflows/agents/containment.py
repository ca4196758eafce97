"""Containment of the processes a Flow author's code starts: python tools, skill scripts, stdio MCP.

Used by :mod:`agentflows.agents.python_tool` (python tools and skills' scripts) and
:mod:`agentflows.agents.mcp` (stdio servers). Such a process runs whatever the Flow's or Agent's
author wrote, inside the runner, so it gets three things:

- **a scrubbed environment** (:func:`scrubbed_env`): only the basics a program needs (``PATH``,
  ``HOME``, locale, time zone, CA bundle locations, the in-cluster API address) plus what the
  tool itself declares. Provider keys, ``KUBECONFIG``, proxies (whose URLs may carry passwords)
  and the ``AGENTFLOWS_SECRET_*`` variables never reach it.
- **resource limits** (:class:`Limits`), set with ``setrlimit`` in the child before the
  command starts: memory, CPU time, size of files written, processes (counted on top of those
  the user already runs, since the kernel counts per user), no core dumps. Memory is limited
  with ``RLIMIT_DATA`` (every private writable mapping, heap and anonymous ``mmap`` alike, on
  Linux 4.7+) rather than ``RLIMIT_AS``: runtimes such as Node and Go reserve gigabytes of
  address space they never touch, and would not start under an address-space limit.
- **a launcher that owns its whole process tree** (:mod:`agentflows.agents.tool_launcher`, run
  by :func:`command`): it sets the limits, starts its own session, becomes a child subreaper (so
  a grandchild that calls ``setsid`` and whose parent exits is re-parented to the launcher, not
  to init), runs the command as its child and, when the command exits or the launcher receives
  SIGTERM, SIGKILLs every descendant it still has. The caller stops a run by sending SIGTERM to
  the launcher (:func:`stop`), then SIGKILL to the process group (:func:`kill_group`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from agentflows.agents import tool_launcher

#: Environment variables passed through from the host (see module docstring).
BASIC_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "USER",
        "LOGNAME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    }
)
#: Locale variables (``LC_ALL``, ``LC_CTYPE`` ...) pass too.
_LOCALE_PREFIX = "LC_"
MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one contained process tree."""

    #: Writable memory of each process, in bytes (RLIMIT_DATA).
    memory_bytes: int = 512 * MIB
    #: CPU time of each process, in seconds (RLIMIT_CPU); SIGXCPU when reached.
    cpu_seconds: int = 60
    #: Largest file a process may write, in bytes (RLIMIT_FSIZE); SIGXFSZ when exceeded.
    file_bytes: int = 64 * MIB
    #: Processes and threads the tree may add to those its user already runs (RLIMIT_NPROC).
    processes: int = 64


def scrubbed_env(host_env: Mapping[str, str], declared: Mapping[str, str] = {}) -> dict[str, str]:
    """The environment of a contained process: the host's basics plus ``declared``."""
    basics = {
        key: value
        for key, value in host_env.items()
        if key in BASIC_ENV or key.startswith(_LOCALE_PREFIX)
    }
    return {**basics, **declared}


def command(argv: Sequence[str], limits: Limits) -> list[str]:
    """The command line that runs ``argv`` contained under ``limits``."""
    numbers = [limits.memory_bytes, limits.cpu_seconds, limits.file_bytes, limits.processes]
    script = os.path.abspath(tool_launcher.__file__)
    return [sys.executable, "-I", script, *map(str, numbers), "--", *argv]


def exit_reason(returncode: int | None, limits: Limits) -> str | None:
    """Say which limit ended a process that exited with ``returncode``, when one did."""
    if returncode is None:
        return None
    signum = -returncode if returncode < 0 else returncode - 128
    if signum == signal.SIGXCPU:
        return f"used more than {limits.cpu_seconds} s of CPU time"
    if signum == signal.SIGXFSZ:
        return f"wrote a file larger than {limits.file_bytes // MIB} MiB"
    return None


def stop(pid: int) -> None:
    """Ask the launcher ``pid`` to kill its whole tree (SIGTERM); see :func:`kill_group`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (whatever the launcher left, or the launcher)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
