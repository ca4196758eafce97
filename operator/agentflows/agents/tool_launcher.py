"""The launcher of contained processes: a PID namespace, an identity of their own, limits.

Run as a script by :func:`agentflows.agents.containment.command`, never imported by the runner
for its functions::

    python -I tool_launcher.py MEMORY CPU FILES PROCESSES PARENT SCRATCH HIDDEN -- COMMAND ARGS...

``PARENT`` is the pid of the process that starts it (the runner or CLI); ``SCRATCH`` is the
command's working directory, created by the caller and removed when the launcher exits, or ``-``
to keep the caller's (stdio MCP servers, whose arguments may name files relative to it);
``HIDDEN`` is a directory whose files the command may not read (the runner pod's secrets
volume), or ``-``.
The process tree it starts is::

    launcher (the caller's child)  --  init (PID 1 of a new PID namespace)  --  the command

- **The launcher** dies with its parent (``PR_SET_PDEATHSIG`` SIGTERM, and it exits at once
  when the parent is already gone), leads its own session, and on SIGTERM, SIGINT or SIGHUP
  SIGKILLs init, waits for it, removes the scratch directory and exits 128 + the signal.
  Otherwise it waits for init and exits as init did.
- **init** is PID 1 of a new PID namespace (``unshare(CLONE_NEWPID)``) and has a mount namespace
  of its own with a fresh ``/proc`` of that PID namespace: the command sees no process but its
  own descendants, so no ancestor's ``environ``, ``cmdline``, ``mem``, ``fd`` or ``cwd``. init
  runs the command as its child, reaps orphans, and exits as the command did when it exits.
  When init dies, however it dies, the kernel SIGKILLs every process left in the namespace,
  whatever they did (``setsid``, double forks, forking and exiting in a loop) and before init's
  parent can see it exit. init dies with the launcher (``PR_SET_PDEATHSIG`` SIGKILL).
- **The command**, when the launcher runs as root, runs as a uid and gid of its own
  (:data:`UID_BASE` + the launcher's pid, unique among live launchers), with no supplementary
  groups, hence no capabilities: it reads only what any user may read, cannot trace or signal
  the runner, and ``RLIMIT_NPROC`` (which the kernel never applies to uid 0) holds. Not root, it
  keeps the caller's uid (the kernel counts ``RLIMIT_NPROC`` per user, so the limit is PROCESSES
  on top of the tasks the user runs already). Either way it gets ``no_new_privs`` (no setuid
  program gives privileges back), the resource limits, no file descriptor but 0-2, and the
  scratch directory as its working directory (owned by its uid, and its ``HOME`` when the
  launcher is root).
- **The hidden paths** (those that exist: the runner's secret files, the pod's service-account
  token, the kubeconfig files of ``$KUBECONFIG``;
  :func:`agentflows.agents.containment.hidden_paths`) are closed to the command by a Landlock
  ruleset (:func:`_hide`): reading a file is allowed beneath everything except them, so the
  command may list a hidden directory but not read what it holds, whatever its uid. In a pod
  the runner and its tools share a uid (without ``CAP_SETUID`` there is no other), so file
  modes alone cannot keep the runner's credentials from a tool; Landlock needs no privilege
  (only ``no_new_privs``). Where the kernel has no Landlock (before Linux 5.13, or not
  enabled) and the command's identity could read a hidden file, the launcher refuses to start
  it (exit 126, saying why) rather than run it next to the credentials.

Where a PID namespace cannot be made (no ``CAP_SYS_ADMIN``: a non-root user, or a container
without it), the launcher falls back to what it did before namespaces: it becomes a child
subreaper (Linux ``prctl``), so that a descendant whose parent exits is re-parented here, runs the
command as its child and, when the command exits or on a signal, SIGKILLs every descendant it
finds through ``/proc``. The runner's own ``/proc`` files are then protected by its being
non-dumpable (:func:`agentflows.agents.containment.protect_this_process`).

Run by path with ``-I``, it imports only what it uses from the standard library: it starts
within a few milliseconds of the interpreter itself.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from collections.abc import Sequence
from typing import Any

#: ``prctl`` options (linux/prctl.h).
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
#: ``unshare`` and ``mount`` flags (linux/sched.h, linux/mount.h).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
#: Landlock (linux/landlock.h): syscall numbers (the same on every architecture), the one
#: access right handled, the rule type, and ``O_PATH``.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_ACCESS_FS_READ_FILE = 1 << 2
_LANDLOCK_RULE_PATH_BENEATH = 1
#: Rounds of making the directories the command needs reachable (one level of nesting each).
_OPEN_ROUNDS = 8
#: First uid (and gid) of the commands a root launcher runs: UID_BASE + the launcher's pid.
UID_BASE = 1 << 30
#: Rounds of "find descendants, kill them" before the fallback gives up on a racing fork.
_KILL_ROUNDS = 50
#: Signals on which the launcher kills its tree and exits.
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_libc: Any = None


def _call(name: str, *args: Any) -> None:
    """Call libc's ``name``; raise OSError when it fails."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def _apply(memory_bytes: int, cpu_seconds: int, file_bytes: int, processes: int) -> None:
    """Set each limit, soft and hard, never above a hard limit already in place."""

    def cap(which: int, value: int) -> None:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_DATA, memory_bytes)
    cap(resource.RLIMIT_CPU, cpu_seconds)
    cap(resource.RLIMIT_FSIZE, file_bytes)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, processes)


def _tasks_of_user(uid: int) -> int:
    """Processes and threads the kernel counts against ``uid``'s RLIMIT_NPROC (Linux)."""
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
    """SIGKILL every descendant, reaping as they die, until none is left (the fallback)."""
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


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


class _Launch:
    """What the launcher was asked to run, and how it runs it."""

    def __init__(self, argv: Sequence[str]) -> None:
        separator = list(argv).index("--")
        memory, cpu, files, processes, parent = (int(n) for n in argv[1 : separator - 2])
        self.limits = (memory, cpu, files, processes)
        self.parent = parent
        self.scratch = argv[separator - 2]
        hidden = argv[separator - 1]
        #: Paths the command may not read (their realpaths; ``-``: none).
        self.hidden = [os.path.realpath(p) for p in hidden.split(os.pathsep) if hidden != "-"]
        self.target = list(argv[separator + 1 :])
        self.root = os.geteuid() == 0
        self.uid = UID_BASE + os.getpid() if self.root else os.getuid()
        self.gid = UID_BASE + os.getpid() if self.root else os.getgid()
        self.namespaced = False
        self.child = 0

    def prepare(self) -> None:
        """Die with the parent; lead a session; make the scratch directory; try a namespace."""
        _call("prctl", _PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != self.parent:
            self.clean()  # the parent died before the line above
            sys.exit(128 + signal.SIGTERM)
        # A group leader cannot start a session, and leads its group already (start_new_session).
        if os.getpgid(0) != os.getpid():
            os.setsid()
        if self.root and self.scratch != "-":
            os.chown(self.scratch, self.uid, self.gid)
        try:
            _call("unshare", _CLONE_NEWPID)
            self.namespaced = True
        except OSError:
            _call("prctl", _PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        for signum in _HANDLED:
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, _frame: object) -> None:
        """Kill everything started, remove the scratch directory, exit 128 + ``signum``."""
        if self.namespaced and self.child:
            os.kill(self.child, signal.SIGKILL)
        else:
            _kill_tree()
        _reap()
        self.clean()
        os._exit(128 + signum)

    def clean(self) -> None:
        if self.scratch == "-":
            return
        import shutil

        shutil.rmtree(self.scratch, ignore_errors=True)

    def run(self) -> int:
        """Start init (or, without a namespace, the command) and wait for it."""
        self.child = os.fork()
        if self.child == 0:
            if self.namespaced:
                self.init()
            self.exec_target()
        try:
            _, status = os.waitpid(self.child, 0)
        finally:
            if not self.namespaced:
                _kill_tree()
            self.clean()
        return _exit_code(status)

    def init(self) -> None:
        """PID 1 of the namespace: a private /proc, then the command, then exit as it did."""
        for signum in _HANDLED:
            signal.signal(signum, signal.SIG_IGN)
        try:
            _call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _call("unshare", _CLONE_NEWNS)
            _call("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
            if self.root:
                _reach(self.needed(), self.uid, self.gid)
            _call("mount", b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        except OSError as exc:
            os.write(2, f"agentflows tool launcher: cannot isolate the tool: {exc}\n".encode())
            os._exit(126)
        command = os.fork()
        if command == 0:
            self.exec_target()
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                os._exit(127)
            if pid == command:
                # Exiting kills every process left in the namespace (the kernel does).
                os._exit(_exit_code(status))

    def needed(self) -> list[str]:
        """What the command must reach: the interpreter, its command and files, its scratch."""
        import shutil

        program = shutil.which(self.target[0]) or self.target[0]
        files = [sys.executable, program, *(arg for arg in self.target[1:] if arg.startswith("/"))]
        # A path is reached both as written (a virtualenv's bin/python, in a directory of
        # mktemp's 0700) and as its symlinks resolve (into /root/.pyenv); an interpreter's
        # prefixes are reached whole (pyvenv.cfg, lib/), marked by a trailing slash.
        wholes = {sys.prefix, sys.base_prefix, sys.exec_prefix, self.scratch}
        paths = [*files, *map(os.path.realpath, files)]
        paths += [os.path.realpath(path) + "/" for path in wholes]
        return [path for path in dict.fromkeys(paths) if os.path.isabs(path)]

    def exec_target(self) -> None:
        """Become the command: identity, no new privileges, limits, fds 0-2 only; exec."""
        try:
            for signum in (*_HANDLED, signal.SIGPIPE, signal.SIGXFSZ):
                # Python ignores SIGPIPE and SIGXFSZ; as subprocess does, the command gets the
                # defaults.
                signal.signal(signum, signal.SIG_DFL)
            memory, cpu, files, processes = self.limits
            _call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            present = [p for p in self.hidden if os.path.lexists(p)]
            if present:
                # Before the identity changes: the directories on the way are listed as the
                # launcher's user (a Landlock domain survives setuid, and everything after).
                _hide(present)
            if self.root:
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
            elif not self.namespaced:
                processes += _tasks_of_user(self.uid)
            _apply(memory, cpu, files, processes)
            env = dict(os.environ)
            if self.scratch != "-":
                os.chdir(self.scratch)
                if self.root:
                    env["HOME"] = self.scratch  # root's home is not its to write
            os.closerange(3, 1 << 20)
            os.execvpe(self.target[0], self.target, env)
        except OSError as exc:
            os.write(2, f"cannot start {self.target[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)


def _reach(paths: Sequence[str], uid: int, gid: int) -> None:
    """Make ``paths`` reachable for ``uid``, in this mount namespace, and nothing beside them.

    A directory on the way that ``uid`` (with only the group ``gid``) may not search
    (``/root``, where pyenv and many virtualenvs live) is covered with an empty tmpfs they may
    search, into which only the entries leading to ``paths`` are bind-mounted from the
    original; the rest of it (root's kubeconfig, keys, history) is gone for the command.
    Repeated for directories further down. A path ending in ``/`` is a directory needed whole:
    if it cannot be searched itself, it is covered holding all of its entries.
    """
    for _ in range(_OPEN_ROUNDS):
        blocked: dict[str, set[str]] = {}
        for path in paths:
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth]) or "/"
                try:
                    searchable = _searchable(os.stat(directory), uid, gid)
                    entries = {parts[depth]} if parts[depth] else set(os.listdir(directory))
                except OSError:
                    break
                if not searchable:
                    blocked.setdefault(directory, set()).update(entries)
                    break
        if not blocked:
            return
        for directory, entries in blocked.items():
            _cover(directory, entries)


def _searchable(status: os.stat_result, uid: int, gid: int) -> bool:
    if status.st_uid == uid:
        return bool(status.st_mode & 0o100)
    if status.st_gid == gid:
        return bool(status.st_mode & 0o010)
    return bool(status.st_mode & 0o001)


def _cover(directory: str, entries: set[str]) -> None:
    """Mount a searchable tmpfs on ``directory`` holding only ``entries`` of the original."""
    original = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    flags = _MS_NOSUID | _MS_NODEV
    _call("mount", b"tmpfs", directory.encode(), b"tmpfs", flags, b"mode=0711,size=64k")
    for entry in entries:
        source = f"/proc/self/fd/{original}/{entry}"
        target = os.path.join(directory, entry)
        if os.path.isdir(source):
            os.mkdir(target)
        elif os.path.exists(source):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        else:
            continue
        _call("mount", source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None)
    os.close(original)


def _hide(hidden: Sequence[str]) -> None:
    """Allow this process (and what it starts) to read files anywhere but ``hidden`` paths.

    A Landlock ruleset handling only ``READ_FILE``, with a rule for every entry of each directory
    on the way from ``/`` down to a hidden path except those on the way to one and the hidden
    paths themselves (symlinks are left out: what they point to is covered where it is).
    Without Landlock, exits 126 if this identity could read a hidden file; else it has nothing
    to hide from.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    handled = ctypes.c_uint64(_LANDLOCK_ACCESS_FS_READ_FILE)
    ruleset = libc.syscall(
        _SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(handled), ctypes.sizeof(handled), 0
    )
    if ruleset < 0:
        why = os.strerror(ctypes.get_errno())
        for path in hidden:
            _refuse_unless_unreadable(path, why)
        return
    ways: set[str] = set()
    for path in hidden:
        parts = [part for part in path.split("/") if part]
        ways.update("/" + "/".join(parts[:depth]) for depth in range(len(parts)))
    for directory in sorted(ways):
        for entry in os.listdir(directory):
            path = os.path.join(directory, entry)
            if path in hidden or path in ways or os.path.islink(path):
                continue
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            # struct landlock_path_beneath_attr, packed: u64 allowed_access, s32 parent_fd
            access = _LANDLOCK_ACCESS_FS_READ_FILE.to_bytes(8, sys.byteorder)
            rule = ctypes.create_string_buffer(access + fd.to_bytes(4, sys.byteorder), 12)
            added = libc.syscall(
                _SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0
            )
            os.close(fd)
            if added != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def _refuse_unless_unreadable(hidden: str, why: str) -> None:
    """Exit 126 when this process could read a file beneath ``hidden`` (no Landlock: ``why``)."""
    message = (
        f"agentflows tool launcher: refusing to start the tool: it could read the runner's "
        f"credentials in {hidden} and the kernel offers no Landlock to prevent it ({why}; "
        f"Linux 5.13 or later with Landlock enabled is needed)\n"
    )
    files = [hidden] if os.path.isfile(hidden) else []
    files += [os.path.join(root, name) for root, _, names in os.walk(hidden) for name in names]
    if any(os.access(path, os.R_OK) for path in files):
        os.write(2, message.encode())
        os._exit(126)


def main(argv: Sequence[str]) -> int:
    """Run the command after ``--`` contained; exit as the command exited."""
    launch = _Launch(argv)
    launch.prepare()
    return launch.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
