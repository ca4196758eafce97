"""The memory and file stores pass the checkpoint store contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentflows.engine import store

from .store_contract import StoreContract


class MemoryBackend:
    def __init__(self) -> None:
        self.shared = store.MemoryStore()

    def new_store(self) -> store.MemoryStore:
        return self.shared  # the same memory is the durable state

    async def decide(self, st: Any, request_id: str, **fields: Any) -> None:
        await self.shared.decide(request_id, **fields)


class FileBackend:
    def __init__(self, path: Path) -> None:
        self.path = path

    def new_store(self) -> store.FileStore:
        return store.FileStore(self.path)

    async def decide(self, st: Any, request_id: str, **fields: Any) -> None:
        await store.FileStore(self.path).decide(request_id, **fields)


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def backend(self) -> MemoryBackend:
        return MemoryBackend()


class TestFileStore(StoreContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "run.json")

    async def test_file_is_replaced_atomically_and_leaves_no_temp_files(
        self, tmp_path: Path
    ) -> None:
        st = store.FileStore(tmp_path / "run.json")
        for i in range(5):
            await st.save_node(
                f"n{i}",
                __import__("agentflows.api.flowrun", fromlist=["x"]).NodeStatus(phase="Succeeded"),
            )
        assert sorted(p.name for p in tmp_path.glob("*")) == ["run.json"]
