"""Which modules a process had loaded, sorted into ours, the standard library's and the rest.

Used by the start-path tests (``tests/unit/test_cli_start_path.py``, ``test_runner_start.py``),
which record ``sys.modules`` at a process's first node or first model request and hold the
third-party packages found there to a list of those allowed, each with its reason.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterable

#: What the interpreter or the environment loads into every process, ours or not: Cython's
#: runtime modules, setuptools' distutils shim (a .pth file), site customization.
NOT_OURS = ("__main__", "cython_runtime", "_distutils_hack", "sitecustomize", "usercustomize")
NOT_OURS_PREFIXES = ("_cython_", "_sysconfigdata_")


@functools.cache
def at_interpreter_start() -> frozenset[str]:
    """The modules this environment's interpreter has loaded before any of its code runs.

    A site's ``.pth`` files run at every start and may import packages: a machine that
    appends a proxy's CA to certifi's bundle imports ``certifi`` into every process, ours or
    not. What a bare ``python -c pass`` of the same interpreter and environment has loaded is
    not the command's doing.
    """
    done = subprocess.run(
        [sys.executable, "-c", "import sys; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return frozenset(done.stdout.split())


def third_party(modules: Iterable[str]) -> set[str]:
    """The top-level packages of ``modules`` that are neither the standard library nor ours,
    nor loaded by the interpreter's start in this environment (:func:`at_interpreter_start`)."""
    tops = {m.partition(".")[0] for m in modules}
    at_start = {m.partition(".")[0] for m in at_interpreter_start()}
    return {
        top
        for top in tops - set(sys.stdlib_module_names) - {"agentflows", *NOT_OURS} - at_start
        if not top.startswith(NOT_OURS_PREFIXES)
    }


def loaded_of(modules: Iterable[str], names: Iterable[str]) -> list[str]:
    """The modules of ``names`` (packages with their submodules) found in ``modules``."""
    wanted = tuple(names)
    return sorted(m for m in modules for n in wanted if m == n or m.startswith(n + "."))
