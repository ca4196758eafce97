"""The ``agentflows`` console script: the runner's command first, else the whole CLI.

A runner pod starts with ``agentflows runner ...`` and has its first model request to make:
importing :mod:`agentflows.cli.main` would load every other command and what they need
(Agent Spec, local runs, cluster views) first. So ``runner`` goes straight to
:mod:`agentflows.cli.runner_command` (and :mod:`agentflows.runner.main`); anything else,
``--help`` included, to the full group.

The cyclic garbage collector is off while those modules are imported, and what they created
is then frozen (:func:`gc.freeze`: left out of every later collection) before the collector is
turned back on for the command. An import makes objects that live as long as the process and
almost no garbage, yet each few hundred of them trigger a collection that walks the young
ones: about a hundred collections, 25-45 ms of CPU, before ``agentflows run``'s first node
(issue 25). A command runs with the collector on, as any Python program.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

#: Optional modules that httpx (its command-line tool: rich, pygments) and httpcore (HTTP/2:
#: h2, hpack; trio's locks) import whenever they are installed. A runner uses none of them
#: (it runs on asyncio), and they cost about 70 ms of CPU before its first request, trio
#: another 85 ms or more where something else installed it. ``None`` in ``sys.modules`` makes
#: their import fail as if they were not installed, which these libraries expect and handle.
_NOT_FOR_THE_RUNNER = ("httpx._main", "h2", "trio")


@contextlib.contextmanager
def _importing() -> Iterator[None]:
    """Import without garbage collections, then freeze what was imported (module docstring)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main() -> None:
    """Run ``agentflows`` with the arguments of this process."""
    with _importing():
        from agentflows.agents import containment

        # First thing: no tool of this process may read its environment (provider keys) or
        # memory.
        containment.protect_this_process()
        if sys.argv[1:2] == ["runner"]:
            for name in _NOT_FOR_THE_RUNNER:
                sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # see above
            from agentflows.cli import runner_command
            from agentflows.runner import main as _runner_main  # noqa: F401  # what it runs
        else:
            from agentflows.cli import main as cli_main
    if sys.argv[1:2] == ["runner"]:
        runner_command.runner.main(sys.argv[2:], prog_name="agentflows runner")
        return
    cli_main.main()
