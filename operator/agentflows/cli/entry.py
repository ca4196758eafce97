"""The ``agentflows`` console script: the runner's command first, else the whole CLI.

A runner pod starts with ``agentflows runner ...`` and has its first model request to make:
importing :mod:`agentflows.cli.main` would load every other command and what they need
(Agent Spec, local runs, cluster views) first. So ``runner`` goes straight to
:mod:`agentflows.cli.runner_command`; anything else, ``--help`` included, to the full group.
"""

from __future__ import annotations

import sys

from agentflows.agents import containment

#: Optional modules that httpx (its command-line tool: rich, pygments) and httpcore (HTTP/2:
#: h2, hpack) import whenever they are installed. A runner uses neither, and together they
#: cost about 70 ms of CPU before its first request. ``None`` in ``sys.modules`` makes their
#: import fail as if they were not installed, which both libraries expect and handle.
_NOT_FOR_THE_RUNNER = ("httpx._main", "h2")


def main() -> None:
    """Run ``agentflows`` with the arguments of this process."""
    # First thing: no tool of this process may read its environment (provider keys) or memory.
    containment.protect_this_process()
    if sys.argv[1:2] == ["runner"]:
        for name in _NOT_FOR_THE_RUNNER:
            sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # see above
        from agentflows.cli import runner_command

        runner_command.runner.main(sys.argv[2:], prog_name="agentflows runner")
        return
    from agentflows.cli import main as cli_main

    cli_main.main()
