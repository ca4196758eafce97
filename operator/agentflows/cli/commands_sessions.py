"""``agentflows sessions list|show|delete``: the conversations agents keep across runs.

Local sessions (under the state directory's ``sessions/`` folder, where ``agentflows run``
keeps them) by default; with ``-n/--namespace``, ``--kubeconfig`` or ``--context``, the
cluster's ``AgentSession`` objects. Both stores implement
:class:`agentflows.agents.sessions.Store`, so the commands print the same in both places.
Registered on the ``agentflows`` group by :mod:`agentflows.cli.main` (imported when run).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from agentflows.cli import commands_cluster, group, local

if TYPE_CHECKING:
    from agentflows.agents import sessions

T = TypeVar("T")

#: Characters of a message shown by ``show`` before it is cut (``-o json`` shows all).
_SHOWN_CHARS = 400

_state_dir_option = click.option(
    "--state-dir",
    help="Local state directory (default: $AGENTFLOWS_STATE_DIR or .agentflows/runs).",
)


def _where(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(
        (
            _state_dir_option,
            commands_cluster.namespace_option,
            commands_cluster.kubeconfig_option,
            commands_cluster.context_option,
        )
    ):
        command = option(command)
    return command


def _with_store(
    params: dict[str, Any], use: Callable[[sessions.Store], Coroutine[Any, Any, T]]
) -> T:
    """Run ``use`` with the store the options name; bad input exits 2 with one line."""
    from agentflows.agents import sessions

    cluster = params["namespace"] or params["kubeconfig"] or params["kube_context"]
    if cluster and params["state_dir"]:
        _usage("--state-dir and -n/--kubeconfig/--context name different places; give one")
    try:
        if not cluster:
            return asyncio.run(use(local.session_store(local.state_dir(params["state_dir"]))))
        return asyncio.run(_on_cluster(params, use))
    except sessions.StoreError as exc:
        _usage(str(exc))
    except ValueError as exc:  # a stored file that is not a session
        _usage(f"a stored session is unreadable: {exc}")


async def _on_cluster(
    params: dict[str, Any], use: Callable[[sessions.Store], Coroutine[Any, Any, T]]
) -> T:
    from agentflows.kube import session_store

    api = commands_cluster._client(params["kubeconfig"], params["kube_context"])
    async with api:
        namespace = params["namespace"] or api.config.namespace
        return await use(session_store.SessionStore(api, namespace))


def _usage(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(group.EXIT_INVALID)


@click.group("sessions")
def sessions_group() -> None:
    """Conversations agents continue across runs (a node's or Agent's `session`)."""


@sessions_group.command("list")
@click.option("--memory", help="Only sessions of this memory (an Agent's name or a shared one).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table")
@_where
def list_sessions(memory: str | None, output: str, **params: Any) -> None:
    """List stored sessions, least recently written first."""
    found = _with_store(params, lambda store: store.list(memory))
    if output == "json":
        click.echo(json.dumps([_info_json(info) for info in found], indent=2))
        return
    rows = [("MEMORY", "SESSION", "TURNS", "BYTES", "UPDATED")]
    rows += [(i.memory, i.session, str(i.turns), str(i.size), i.updated_at) for i in found]
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    for row in rows:
        click.echo("  ".join([*(v.ljust(w) for v, w in zip(row, widths, strict=False)), row[4]]))


@sessions_group.command("show")
@click.argument("memory")
@click.argument("session")
@click.option("--request", help="Only the conversation of this request id.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
@_where
def show_session(
    memory: str, session: str, request: str | None, output: str, **params: Any
) -> None:
    """Show the conversations of SESSION in MEMORY."""
    record = _with_store(params, lambda store: store.read(memory, session))
    if record is None:
        _usage(f"no session {session!r} in memory {memory!r}")
    conversations = [c for c in record.conversations if request is None or c.request == request]
    if output == "json":
        wire = record.model_dump(mode="json", by_alias=True, exclude_none=True)
        wire["conversations"] = [
            c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conversations
        ]
        click.echo(json.dumps(wire, indent=2, ensure_ascii=False))
        return
    click.echo(f"memory {record.memory}, session {record.session}, agent {record.agent}")
    click.echo(f"{record.turns} turn(s), last written {record.updated_at}")
    for conversation in conversations:
        name = "request " + conversation.request if conversation.request else "session"
        click.echo(
            f"\n{name}: {conversation.turns} turn(s), {len(conversation.messages)} message(s), "
            f"compacted {conversation.compactions} time(s), written {conversation.updated_at}"
        )
        for message in conversation.messages:
            click.echo(f"  {_line(message)}")


@sessions_group.command("delete")
@click.argument("memory")
@click.argument("session")
@_where
def delete_session(memory: str, session: str, **params: Any) -> None:
    """Delete SESSION of MEMORY (its next run starts a new conversation)."""
    if not _with_store(params, lambda store: store.delete(memory, session)):
        _usage(f"no session {session!r} in memory {memory!r}")
    click.echo(f"deleted session {session!r} of memory {memory!r}")


def _info_json(info: sessions.SessionInfo) -> dict[str, Any]:
    return {
        "memory": info.memory,
        "session": info.session,
        "turns": info.turns,
        "bytes": info.size,
        "updatedAt": info.updated_at,
        "where": info.where,
    }


def _line(message: Any) -> str:
    if not isinstance(message, dict):
        return json.dumps(message)[:_SHOWN_CHARS]
    text = message.get("content") or ""
    calls = [c.get("function", {}).get("name") for c in message.get("tool_calls") or []]
    if calls:
        text = f"{text} [calls {', '.join(str(c) for c in calls)}]".strip()
    text = str(text).replace("\n", " ")
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    return f"{message.get('role')}: {text}"


COMMANDS = [sessions_group]
