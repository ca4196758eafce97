"""The informer's cache never goes back in time: a write's answer and late watch events."""

from __future__ import annotations

from typing import Any

from agentflows.kube import informer


def obj(name: str, version: int, value: str) -> dict[str, Any]:
    meta = {"namespace": "ns", "name": name, "resourceVersion": str(version)}
    return {"metadata": meta, "value": value}


def make() -> tuple[informer.Informer[str], list[tuple[Any, Any]]]:
    changes: list[tuple[Any, Any]] = []
    cache: informer.Informer[str] = informer.Informer(
        None,  # type: ignore[arg-type]  (no API request is made by put)
        "/api/v1/namespaces/ns/things",
        lambda o: str(o["value"]),
        on_change=lambda _key, old, new: changes.append((old, new)),
    )
    return cache, changes


def test_an_older_version_arriving_after_a_write_answer_is_ignored() -> None:
    cache, changes = make()
    cache.put(obj("a", 5, "written"))
    cache.put(obj("a", 4, "stale event"))
    assert cache.get("ns", "a") == "written"
    cache.put(obj("a", 6, "newer"))
    assert cache.get("ns", "a") == "newer"
    assert changes == [(None, "written"), ("written", "newer")]


def test_a_write_answer_older_than_a_deletion_does_not_bring_the_object_back() -> None:
    cache, changes = make()
    cache.put(obj("a", 5, "v5"))
    cache._apply(obj("a", 7, "v5"), deleted=True)
    cache.put(obj("a", 6, "late answer"))
    assert cache.get("ns", "a") is None
    cache.put(obj("a", 9, "created again"))
    assert cache.get("ns", "a") == "created again"
    assert changes == [(None, "v5"), ("v5", None), (None, "created again")]


def test_an_object_converted_to_nothing_is_not_kept() -> None:
    changes: list[tuple[Any, Any]] = []
    cache: informer.Informer[str] = informer.Informer(
        None,  # type: ignore[arg-type]
        "/x",
        lambda o: None,
        on_change=lambda _key, old, new: changes.append((old, new)),
    )
    cache.put(obj("a", 1, "v"))
    assert len(cache) == 0 and changes == []


def test_the_watch_echo_of_a_written_version_is_not_converted_or_reported_again() -> None:
    converted: list[str] = []
    changes: list[tuple[Any, Any]] = []

    def convert(o: Any) -> str:
        converted.append(str(o["value"]))
        return str(o["value"])

    cache: informer.Informer[str] = informer.Informer(
        None,  # type: ignore[arg-type]
        "/x",
        convert,
        on_change=lambda _key, old, new: changes.append((old, new)),
    )
    cache.put(obj("a", 5, "written"))
    cache._apply(obj("a", 5, "written"))  # the same version, as the watch delivers it
    assert converted == ["written"]
    assert changes == [(None, "written")]
    cache._apply(obj("a", 5, "written"), deleted=True)  # a deletion at that version still counts
    assert cache.get("ns", "a") is None
