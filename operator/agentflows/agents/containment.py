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
- **a launcher that owns its whole process tree**: the command runs under this module run as a
  script (:func:`command`). The launcher starts its own session, becomes a child subreaper (so a
  grandchild that calls ``setsid`` and whose parent exits is re-parented to the launcher, not to
  init), runs the command as its child and, when the command exits or the launcher receives
  SIGTERM, SIGKILLs every descendant it still has. The caller stops a run by sending SIGTERM to
  the launcher (:func:`stop`), then SIGKILL to the process group.

The launcher is run as a script by path (``python -I containment.py LIMITS -- COMMAND...``), so
it imports nothing of agentflows and starts in a few milliseconds. On systems without ``/proc``
or ``prctl`` (macOS) it falls back to the process group alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence

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
#: ``prctl`` option that makes a process the reaper of its orphaned descendants (Linux).
_PR_SET_CHILD_SUBREAPER = 36
#: Rounds of "find descendants, kill them" before the launcher gives up on a racing fork.
_KILL_ROUNDS = 50
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

    def describe(self) -> str:
        """The limits as a user reads them."""
        return (
            f"memory {self.memory_bytes // MIB} MiB, CPU {self.cpu_seconds} s, "
            f"files {self.file_bytes // MIB} MiB, {self.processes} processes"
        )


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
    return [sys.executable, "-I", os.path.abspath(__file__), _encode(limits), "--", *argv]


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


def _encode(limits: Limits) -> str:
    return json.dumps(dataclasses.asdict(limits), separators=(",", ":"))


# -- the launcher (runs in the child, as a script) ---------------------------------------------


def _apply(limits: Limits) -> None:
    import resource

    def cap(which: int, value: int) -> None:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_DATA, limits.memory_bytes)
    cap(resource.RLIMIT_CPU, limits.cpu_seconds)
    cap(resource.RLIMIT_FSIZE, limits.file_bytes)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, _tasks_of_user() + limits.processes)


def _tasks_of_user() -> int:
    """Processes and threads the kernel counts against this user's RLIMIT_NPROC (Linux)."""
    uid = os.getuid()
    count = 0
    for entry in _proc_pids():
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{entry}").st_uid == uid:
                count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def _proc_pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, from each process's parent in ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid in _proc_pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(pid)
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _kill_tree() -> None:
    """SIGKILL every descendant, reaping as they die, until none is left."""
    me = os.getpid()
    for _ in range(_KILL_ROUNDS):
        targets = _descendants(me)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        if not targets:
            return


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _on_signal(signum: int, _frame: object) -> None:
    _kill_tree()
    os._exit(128 + signum)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main(argv: Sequence[str]) -> int:
    """Run ``argv[3:]`` contained by the limits in ``argv[1]``; exit as it exited."""
    limits = Limits(**json.loads(argv[1]))
    target = list(argv[3:])
    if os.getsid(0) != os.getpid():
        with contextlib.suppress(OSError):
            os.setsid()
    _become_subreaper()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    _apply(limits)
    child = os.fork()
    if child == 0:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execvp(target[0], target)
        except OSError as exc:
            os.write(2, f"cannot start {target[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)
    _, status = os.waitpid(child, 0)
    _kill_tree()
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
