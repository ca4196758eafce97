"""Sessions kept as files: the local :class:`~agentflows.agents.sessions.Store`.

``agentflows run`` (with the state directory's ``sessions/`` folder) and ``agentflows sessions``
use it. One JSON file per session, ``<dir>/<memory>/<readable part>-<digest>.json`` holding the
:class:`~agentflows.api.agentsession.AgentSessionSpec`; the digest is of the exact session, so
any session string maps to one safe file name. An update holds an exclusive ``flock`` on the
session's ``.lock`` file from its read to its write, so writers in other processes (two
``agentflows run`` at once) wait their turn, and writes go through a temporary file and a
rename, so a reader never sees half a session. Writers inside one process also queue on an
``asyncio`` lock per file, so a ``map`` of fifty items does not fill the thread pool with
waiting ``flock`` calls.

The session modules are imported when a session is first read or written: ``agentflows run``
makes its store before the first node, and most Flows have no memory (issue 25).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: agentflows run makes a store before its first node
    from agentflows.agents import sessions
    from agentflows.api import agent as agent_api
    from agentflows.api import agentsession as agentsession_api

#: Characters of the session kept readable in its file name.
_READABLE_CHARS = 40
_NOT_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class FileStore:
    """Sessions under ``directory`` (see module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._locks: dict[Path, asyncio.Lock] = {}

    def path(self, memory: str, session: str) -> Path:
        """The file of one session."""
        readable = _NOT_FILE_SAFE.sub("-", session)[:_READABLE_CHARS].strip("-.") or "session"
        digest = hashlib.sha256(session.encode()).hexdigest()[:16]
        return self.directory / memory / f"{readable}-{digest}.json"

    async def read(self, memory: str, session: str) -> agentsession_api.AgentSessionSpec | None:
        """The stored session, or None."""
        return await asyncio.to_thread(_load, self.path(memory, session))

    async def update(self, memory: str, session: str, agent: str, change: sessions.Change) -> None:
        """Apply ``change`` under the session's lock and write the result."""
        path = self.path(memory, session)
        async with self._locks.setdefault(path, asyncio.Lock()):
            await asyncio.to_thread(_update, path, change)

    async def list(self, memory: str | None = None) -> list[sessions.SessionInfo]:
        """The stored sessions (of ``memory`` only when given), oldest write first."""
        return await asyncio.to_thread(_list, self.directory, memory)

    async def delete(self, memory: str, session: str) -> bool:
        """Delete one session; False when there was none."""
        path = self.path(memory, session)
        async with self._locks.setdefault(path, asyncio.Lock()):
            return await asyncio.to_thread(_delete, path)

    async def retain(self, memory: str, limits: agent_api.AgentMemory) -> sessions.Retired:
        """Enforce the memory's retention now (locally, after each write)."""
        from agentflows.agents import sessions

        return await sessions.enforce_retention(self, memory, limits)


def _list(directory: Path, memory: str | None) -> list[sessions.SessionInfo]:
    from agentflows.agents import sessions

    folders = [directory / memory] if memory else sorted(directory.glob("*"))
    found = []
    for path in (p for folder in folders for p in sorted(folder.glob("*.json"))):
        record = _load(path)
        if record is not None:
            found.append(
                sessions.SessionInfo(
                    memory=record.memory,
                    session=record.session,
                    turns=record.turns,
                    updated_at=record.updated_at,
                    size=path.stat().st_size,
                    where=str(path),
                )
            )
    return sorted(found, key=lambda info: info.updated_at)


def _load(path: Path) -> agentsession_api.AgentSessionSpec | None:
    from agentflows.api import agentsession as agentsession_api

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return agentsession_api.AgentSessionSpec.model_validate(json.loads(text))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _update(path: Path, change: sessions.Change) -> None:
    with _locked(path):
        record = change(_load(path))
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        text = json.dumps(record.model_dump(mode="json", by_alias=True), ensure_ascii=False)
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)


def _delete(path: Path) -> bool:
    # The lock file stays: removing it would let a writer that opened it lock a lost inode.
    with _locked(path):
        try:
            path.unlink()
        except FileNotFoundError:
            return False
    return True
