"""Containment of the processes a Flow author's code starts: python tools, skill scripts, stdio MCP.

Used by :mod:`agentflows.agents.python_tool` (python tools and skills' scripts) and
:mod:`agentflows.agents.mcp` (stdio servers). Such a process runs whatever the Flow's or Agent's
author wrote, inside the runner, so it gets four things:

- **a scrubbed environment** (:func:`scrubbed_env`): only the basics a program needs (``PATH``,
  ``HOME``, locale, time zone, CA bundle locations, the in-cluster API address) plus what the
  tool itself declares. Provider keys, ``KUBECONFIG``, proxies (whose URLs may carry passwords)
  and the ``AGENTFLOWS_SECRET_*`` variables never reach it; nor do the runner's secret files
  (:func:`agentflows.agents.secrets.root`): the launcher closes that directory to it with a
  Landlock ruleset, since in a pod the tool has the runner's uid and could read them otherwise.
- **resource limits** (:class:`Limits`), set with ``setrlimit`` in the child before the command
  starts (and, in a pod, the container's memory limit, whose OOM kills :func:`oom_killed` tells
  apart from other deaths): memory, CPU time, size of files written, processes, no core dumps.
  Memory is limited with ``RLIMIT_DATA`` (every private writable mapping, heap and anonymous
  ``mmap`` alike, on Linux 4.7+) rather than ``RLIMIT_AS``: runtimes such as Node and Go reserve
  gigabytes of address space they never touch, and would not start under an address-space limit.
- **a launcher that confines the whole process tree** (:mod:`agentflows.agents.tool_launcher`,
  run by :func:`command`, whose docstring has the details): a PID namespace whose init is ours
  (when init exits, the kernel kills every process left in it, whatever it did; the tool sees
  no process of the runner in its own ``/proc``), a uid of its own when the runner is root (so
  no capability, no access to root's files, and ``RLIMIT_NPROC`` holds), ``no_new_privs``, no
  inherited file descriptor, a scratch working directory removed with it, and death with its
  parent (``PR_SET_PDEATHSIG``), so a SIGKILLed CLI leaves no tool running. The caller stops a
  run by sending SIGTERM to the launcher (:func:`stop`), then SIGKILL to the process group
  (:func:`kill_group`).
- **a runner that cannot be read** (:func:`protect_this_process`, called by the ``agentflows``
  command first thing): it is not dumpable, so even a process of the same uid, where no PID
  namespace could be made, cannot read its ``/proc/<pid>/environ``, ``mem`` or ``fd``.

Why a PID namespace rather than a cgroup: it needs no writable cgroup tree (a runner pod has
none; cgroup v1 and v2 differ), its end is the kernel's (init's exit kills the rest, no race
with a process that forks and exits), and the same ``unshare`` hides the runner's processes.
Limits per process come from rlimits, which hold for every uid once a root runner's tools run
as a uid of their own. Where no namespace can be made (a non-root user, a container without
``CAP_SYS_ADMIN``), the launcher falls back to a child subreaper that kills its descendants
through ``/proc``, and the runner's non-dumpable state is what keeps its ``/proc`` files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import sys
from collections.abc import Mapping, Sequence

from agentflows.agents import secrets, tool_launcher
from agentflows.api import runner as runner_api

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
_CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
#: cgroup v1 writes "no limit" as a number this large (a page-rounded LONG_MAX).
_NO_MEMORY_LIMIT = 2**62
#: ``prctl`` option (linux/prctl.h).
_PR_SET_DUMPABLE = 4


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one contained process tree."""

    #: Writable memory of each process, in bytes (RLIMIT_DATA).
    memory_bytes: int = 512 * MIB
    #: CPU time of each process, in seconds (RLIMIT_CPU); SIGXCPU when reached.
    cpu_seconds: int = 60
    #: Largest file a process may write, in bytes (RLIMIT_FSIZE); SIGXFSZ when exceeded.
    file_bytes: int = 64 * MIB
    #: Processes and threads of the tree (RLIMIT_NPROC; on top of those its user already runs
    #: where the tool keeps the runner's uid).
    processes: int = 64


def scrubbed_env(host_env: Mapping[str, str], declared: Mapping[str, str] = {}) -> dict[str, str]:
    """The environment of a contained process: the host's basics plus ``declared``."""
    basics = {
        key: value
        for key, value in host_env.items()
        if key in BASIC_ENV or key.startswith(_LOCALE_PREFIX)
    }
    return {**basics, **declared}


def command(argv: Sequence[str], limits: Limits, scratch: str | None = None) -> list[str]:
    """The command line that runs ``argv`` contained under ``limits``, started by this process.

    ``scratch`` is the command's working directory, removed when it ends; without it the
    launcher makes one. What holds this process's credentials is hidden from the command (the
    launcher's Landlock ruleset, :func:`hidden_paths`).
    """
    numbers = [limits.memory_bytes, limits.cpu_seconds, limits.file_bytes, limits.processes]
    script = os.path.abspath(tool_launcher.__file__)
    return [
        sys.executable,
        "-I",
        script,
        *map(str, numbers),
        str(os.getpid()),
        scratch or "-",
        os.pathsep.join(hidden_paths()) or "-",
        "--",
        *argv,
    ]


def hidden_paths(environ: Mapping[str, str] = os.environ) -> list[str]:
    """What a contained command may not read: where this process's credentials are.

    The runner's secret files (:func:`agentflows.agents.secrets.root`), the pod's
    service-account token (the runner's identity), and the kubeconfig files of
    ``$KUBECONFIG`` (the CLI's or a runner's cluster credentials). A tool runs as its caller's
    uid in a pod, so file modes alone cannot keep these from it.
    """
    kubeconfigs = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    found = [str(secrets.root(environ)), runner_api.SERVICE_ACCOUNT_DIR, *kubeconfigs]
    return [os.path.abspath(p) for p in found]


def protect_this_process() -> None:
    """Make this process non-dumpable: no process without CAP_SYS_PTRACE reads its /proc files.

    ``environ``, ``mem``, ``fd`` and the like of a non-dumpable process belong to root and need
    ``CAP_SYS_PTRACE`` to open, so a tool running as the same uid (where no PID namespace hides
    the runner) cannot read them. It also means no core dump of the runner.
    """
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


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


def _memory_cgroup_dirs() -> list[pathlib.Path]:
    """Where this process's memory cgroup may be seen: its path under the mount, then the mount.

    A container sees its own cgroup at the mount itself (runc bind-mounts it there on cgroup v1;
    a cgroup namespace makes it the root on v2), while ``/proc/self/cgroup`` names the host's path.
    """
    try:
        lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            mount = _CGROUP_ROOT / "memory"
            return [mount / path.lstrip("/"), mount]
        if hierarchy == "0" and not controllers and (_CGROUP_ROOT / "memory.events").exists():
            return [_CGROUP_ROOT / path.lstrip("/"), _CGROUP_ROOT]
    return []


def _memory_cgroup_value(names: Sequence[str], key: str | None = None) -> str | None:
    """The first of the files ``names`` in this process's memory cgroup (its ``key`` line)."""
    for directory in _memory_cgroup_dirs():
        for name in names:
            try:
                text = (directory / name).read_text()
            except OSError:
                continue
            if key is None:
                return text.strip()
            for line in text.splitlines():
                field, _, value = line.partition(" ")
                if field == key:
                    return value.strip()
    return None


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer ended in this process's memory cgroup.

    ``oom_kill`` of ``memory.events`` (cgroup v2) or ``memory.oom_control`` (v1); None where
    neither is readable (a tool's caller then cannot tell an OOM kill from another SIGKILL).
    """
    value = _memory_cgroup_value(("memory.events", "memory.oom_control"), "oom_kill")
    return int(value) if value is not None and value.isdigit() else None


def _memory_limit_bytes() -> int | None:
    value = _memory_cgroup_value(("memory.max", "memory.limit_in_bytes"))
    if value is None or not value.isdigit() or int(value) >= _NO_MEMORY_LIMIT:
        return None
    return int(value)


def oom_killed(returncode: int | None, oom_kills_before: int | None) -> str | None:
    """Say the kernel's OOM killer ended a process, when it did.

    The process exited by SIGKILL (the launcher exits 128 + 9 for it) and :func:`oom_kills`
    rose since ``oom_kills_before``, counted when it started. In a pod that is the container's
    memory limit at work: the kernel kills the largest process of the container, the tool,
    and the runner lives on to record it.
    """
    if returncode is None or oom_kills_before is None:
        return None
    if (-returncode if returncode < 0 else returncode - 128) != signal.SIGKILL:
        return None
    after = oom_kills()
    if after is None or after <= oom_kills_before:
        return None
    limit = _memory_limit_bytes()
    where = f"the memory limit of its container, {limit // MIB} MiB" if limit else "its cgroup"
    return f"ran out of memory: killed by the kernel's OOM killer at {where}"


def stop(pid: int) -> None:
    """Ask the launcher ``pid`` to kill its whole tree (SIGTERM); see :func:`kill_group`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (whatever the launcher left, or the launcher)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
