"""The ``agentflows`` console script: the runner's command first, else the whole CLI.

A runner pod starts with ``agentflows runner ...`` and has its first model request to make:
importing :mod:`agentflows.cli.main` would load every other command and what they need
(Agent Spec, local runs, cluster views) first. So ``runner`` goes straight to
:mod:`agentflows.cli.runner_command`; anything else, ``--help`` included, to the full group.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run ``agentflows`` with the arguments of this process."""
    if sys.argv[1:2] == ["runner"]:
        from agentflows.cli import runner_command

        runner_command.runner.main(sys.argv[2:], prog_name="agentflows runner")
        return
    from agentflows.cli import main as cli_main

    cli_main.main()
