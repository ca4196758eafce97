"""The memory and file stores pass the checkpoint store contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentflows.api import flowrun as flowrun_api
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

    async def test_a_finished_run_leaves_one_state_file_and_no_temp_files(
        self, tmp_path: Path
    ) -> None:
        st = store.FileStore(tmp_path / "run.json")
        for i in range(5):
            await st.save_node(f"n{i}", flowrun_api.NodeStatus(phase="Succeeded"))
        await st.save_outcome(store.Outcome(flowrun_api.RunPhase.SUCCEEDED))
        assert sorted(p.name for p in tmp_path.glob("*")) == ["run.json"]
        assert sorted((await store.FileStore(tmp_path / "run.json").load()).nodes) == [
            f"n{i}" for i in range(5)
        ]

    async def test_a_node_save_does_not_rewrite_the_saved_state(self, tmp_path: Path) -> None:
        st = store.FileStore(tmp_path / "run.json")
        await st.save_node("first", flowrun_api.NodeStatus(phase="Succeeded", output="x" * 10_000))
        await st.load()  # compacts: the state file now holds "first"
        state_file = (tmp_path / "run.json").read_bytes()
        for i in range(50):
            await st.save_node(f"n{i}", flowrun_api.NodeStatus(phase="Succeeded"))
        assert (tmp_path / "run.json").read_bytes() == state_file
        assert len((await st.load()).nodes) == 51

    async def test_a_save_cut_short_by_a_killed_process_is_ignored_on_load(
        self, tmp_path: Path
    ) -> None:
        st = store.FileStore(tmp_path / "run.json")
        await st.save_node("done", flowrun_api.NodeStatus(phase="Succeeded", output=1))
        with st.journal.open("a") as handle:
            handle.write('{"node":"half","status":{"pha')
        loaded = await store.FileStore(tmp_path / "run.json").load()
        assert list(loaded.nodes) == ["done"] and loaded.nodes["done"].output == 1
        await st.save_node("next", flowrun_api.NodeStatus(phase="Succeeded"))
        assert sorted((await st.load()).nodes) == ["done", "next"]

    async def test_a_lone_surrogate_in_a_value_is_saved_and_read_back(self, tmp_path: Path) -> None:
        st = store.FileStore(tmp_path / "run.json")
        await st.save_node("a", flowrun_api.NodeStatus(phase="Succeeded", output={"x": "\ud800"}))
        await st.save_outcome(store.Outcome(flowrun_api.RunPhase.SUCCEEDED, output="\udfff"))
        loaded = store.FileStore(tmp_path / "run.json").read()
        assert loaded.nodes["a"].output == {"x": "\ud800"}
        assert loaded.outcome is not None and loaded.outcome.output == "\udfff"
