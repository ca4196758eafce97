"""The launcher of contained processes: limits, a session, and the whole process tree killed.

Run as a script by :func:`agentflows.agents.containment.command`, never imported by the runner
for its functions::

    python -I tool_launcher.py MEMORY_BYTES CPU_SECONDS FILE_BYTES PROCESSES -- COMMAND ARGS...

It sets the limits (``RLIMIT_DATA``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, no core dumps, and
``RLIMIT_NPROC`` as PROCESSES on top of the tasks its user already runs, since the kernel counts
per user), leads its own session, and becomes a child subreaper (Linux ``prctl``), so that a
descendant whose parent exits is re-parented here rather than to init, ``setsid`` or not. It runs
the command as its only child; when the command exits, or on SIGTERM, SIGINT or SIGHUP, it
SIGKILLs every descendant it still has, found through ``/proc``, and exits: with the command's
status, or 128 + the signal that ended it. Without ``/proc`` or ``prctl`` (macOS) only the
process group is left to the caller's kill.

Run by path with ``-I``, it imports only what it uses from the standard library: it starts
within a few milliseconds of the interpreter itself.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

#: ``prctl`` option that makes a process the reaper of its orphaned descendants (Linux).
_PR_SET_CHILD_SUBREAPER = 36
#: Rounds of "find descendants, kill them" before the launcher gives up on a racing fork.
_KILL_ROUNDS = 50
#: Signals on which the launcher kills its tree and exits.
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _apply(memory_bytes: int, cpu_seconds: int, file_bytes: int, processes: int) -> None:
    """Set each limit, soft and hard, never above a hard limit already in place."""
    import resource

    def cap(which: int, value: int) -> None:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_DATA, memory_bytes)
    cap(resource.RLIMIT_CPU, cpu_seconds)
    cap(resource.RLIMIT_FSIZE, file_bytes)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, _tasks_of_user() + processes)


def _tasks_of_user() -> int:
    """Processes and threads the kernel counts against this user's RLIMIT_NPROC (Linux)."""
    uid = os.getuid()
    count = 0
    for entry in _proc_pids():
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                count += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
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
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
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
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        return


def main(argv: Sequence[str]) -> int:
    """Run the command after ``--`` under the limits before it; exit as the command exited."""
    separator = list(argv).index("--")
    memory, cpu, files, processes = (int(number) for number in argv[1:separator])
    target = list(argv[separator + 1 :])
    # A group leader cannot start a session, and leads its group already (start_new_session).
    if os.getpgid(0) != os.getpid():
        os.setsid()
    _become_subreaper()
    for signum in _HANDLED:
        signal.signal(signum, _on_signal)
    _apply(memory, cpu, files, processes)
    child = os.fork()
    if child == 0:
        # Python ignores SIGPIPE and SIGXFSZ; as subprocess does, the command gets the defaults.
        for signum in (*_HANDLED, signal.SIGPIPE, signal.SIGXFSZ):
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
