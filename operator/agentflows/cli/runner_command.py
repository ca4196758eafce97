"""``agentflows runner``: the runner pod's command, kept apart from the rest of the CLI.

:mod:`agentflows.cli.main` lists it with the other commands; :mod:`agentflows.cli.entry` runs
it directly when it is the command given, so a runner pod imports neither the CLI's other
commands nor what they need before its first node (see :mod:`agentflows.runner.main`).
"""

from __future__ import annotations

import sys

import click

from agentflows.cli import group


@click.command(context_settings=group.CONTEXT_SETTINGS)
@click.option("--namespace", required=True, help="Namespace of the FlowRun.")
@click.option("--flowrun", required=True, help="Name of the FlowRun to run.")
def runner(namespace: str, flowrun: str) -> None:
    """Run one attempt of a FlowRun in its pod (exit 0 Succeeded, 1 Failed, 3 Waiting)."""
    from agentflows.runner import main as runner_main

    sys.exit(runner_main.main(namespace, flowrun))


COMMANDS = [runner]
