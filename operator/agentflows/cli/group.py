"""The ``agentflows`` click group: help in sections, ``-h``, and the exit codes of the CLI.

Exit codes, for every command (a script can tell them apart):

- 0 success; 1 the run failed (Failed or Cancelled) — nothing else exits 1;
- 2 bad input or usage: nothing was run (click's own usage errors are 2 as well);
- 3 the run waits for a human; 4 ``watch``/``start --wait`` gave up while the run goes on;
- 130 interrupted by Ctrl-C (a local run is saved and ``agentflows resume`` continues it);
- 70 an internal error: a bug, reported in one line (the traceback with ``AGENTFLOWS_DEBUG=1``).

click turns Ctrl-C into "Aborted!" and exit 1, and Python exits 1 on an uncaught exception:
both would read as a failed run, so :class:`Group` maps them to 130 and 70.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import click

from agentflows.api import errors

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_WAITING = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


class UsageError(errors.AgentflowsError):
    """The command was called wrongly; the message says how to call it (exit 2).

    Defined here, where every command's exit code is decided, so that catching it costs the
    runner's start path no import of the local-run modules.
    """


#: Help sections: title -> command names, in the order shown.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Run flows on this machine": ("validate", "run", "resume", "graph", "draft"),
    "Runs and human requests (local, or on a cluster)": ("list", "get", "requests"),
    "On a cluster": ("start", "watch", "logs", "approve", "reject", "respond", "crds"),
    "Internal (run by the operator's pods, CronJobs and Deployments)": (
        "operator",
        "runner",
        "trigger",
        "webhook",
    ),
}

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Group(click.Group):
    """A click group that lists its commands in :data:`SECTIONS` and owns the exit codes.

    ``lazy`` maps a command's name to the module that defines it, imported only when that
    command runs (or help or completion lists every command): ``agentflows run`` then loads
    neither the cluster commands nor the builder's nor the console's modules before its first
    node. The module holds the command in ``COMMANDS`` or as its only click command named so.
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, the lazy ones included, sorted."""
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, importing its module the first time it is asked for."""
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module = importlib.import_module(self.lazy[cmd_name])
            found = [c for c in getattr(module, "COMMANDS", []) if c.name == cmd_name]
            if len(found) != 1:
                raise LookupError(f"{module.__name__} defines no single command {cmd_name!r}")
            self.add_command(found[0], cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Write the commands section by section (any command not placed: under Other)."""
        every = {n: self.get_command(ctx, n) for n in self.list_commands(ctx)}
        shown = {n: c for n, c in every.items() if c is not None and not c.hidden}
        placed = {name for names in SECTIONS.values() for name in names}
        sections = [*SECTIONS.items(), ("Other", tuple(sorted(set(shown) - placed)))]
        width = max(len(name) for name in shown)  # one column width across the sections
        for title, names in sections:
            rows = [
                (name.ljust(width), shown[name].get_short_help_str(formatter.width - width - 6))
                for name in names
                if name in shown
            ]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; Ctrl-C exits 130 and an unexpected exception 70, never 1."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except UsageError as exc:
            # A bad run name, wherever a command meets it (local.check_run_name).
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_INVALID)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            if os.environ.get("AGENTFLOWS_DEBUG"):
                traceback.print_exc()
            click.echo(
                f"internal error: {type(exc).__name__}: {exc} (a bug in agentflows; "
                "AGENTFLOWS_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(EXIT_INTERNAL)


@contextlib.contextmanager
def listening(option: str, port: int, host: str = "") -> Iterator[None]:
    """A server that cannot bind its port exits 2 naming the port and the option that chose it.

    Wrapped around every server command's run (the operator's ``--metrics-port``, the webhook
    receiver's and the console's ``--port``): only a bind fails with these errors, and it is a
    bad input (another process holds the port), not a bug.
    """
    try:
        yield
    except OSError as exc:
        where = f"{host}:{port}" if host else f"port {port}"
        if exc.errno == errno.EADDRINUSE:
            message = f"port {port} is in use ({option}): stop what listens there or choose another"
        elif exc.errno == errno.EACCES:
            message = f"may not listen on {where} ({option}): choose a port above 1023"
        elif exc.errno == errno.EADDRNOTAVAIL:
            message = f"cannot listen on {where} (--host): no interface has that address"
        else:
            raise
        click.echo(f"error: {message}", err=True)
        sys.exit(EXIT_INVALID)
