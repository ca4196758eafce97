"""The operator's /metrics as Prometheus reads it: names, labels, and what a scrape sees."""

from __future__ import annotations

import prometheus_client
from prometheus_client import parser

from agentflows.controller import metrics as metrics_mod


def scrape(metrics: metrics_mod.Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> its series (labels, sorted) -> value, as Prometheus parses /metrics."""
    text = prometheus_client.generate_latest(metrics.registry).decode()
    scraped: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            scraped.setdefault(sample.name, {})[labels] = sample.value
    return scraped


def series(metrics: metrics_mod.Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return scrape(metrics).get(name, {})


PENDING_RUN = "agentflows_oldest_pending_run_timestamp_seconds"
PENDING_REQUEST = "agentflows_oldest_pending_request_timestamp_seconds"


def test_a_pending_run_exports_when_it_was_first_seen_until_it_leaves_pending() -> None:
    clock = [1_000.0]
    metrics = metrics_mod.Metrics(clock=lambda: clock[0])
    metrics.observe_run("team-a", "etl-1", "etl", "Pending", {})
    first = series(metrics, PENDING_RUN)
    ((labels, since),) = first.items()
    assert dict(labels) == {"namespace": "team-a", "flow": "etl"}
    assert since == 1_000.0
    clock[0] = 1_005.0

    metrics.observe_run("team-a", "etl-2", "etl", "Pending", {})
    metrics.observe_run("team-a", "etl-1", "etl", "Pending", {})
    assert series(metrics, PENDING_RUN) == first, "the oldest run counts, seen once"

    metrics.observe_run("team-a", "etl-1", "etl", "Running", {})
    metrics.forget_run("team-a", "etl-2")
    assert series(metrics, PENDING_RUN) == {}


def test_an_undecided_request_exports_since_when_its_kind_has_been_pending() -> None:
    metrics = metrics_mod.Metrics()
    metrics.observe_run("team-a", "gate-1", "gate", "Waiting", {"approval": 1})
    first = series(metrics, PENDING_REQUEST)
    assert [dict(labels) for labels in first] == [
        {"namespace": "team-a", "flow": "gate", "kind": "approval"}
    ]
    metrics.observe_run("team-a", "gate-1", "gate", "Waiting", {"approval": 2})
    assert series(metrics, PENDING_REQUEST) == first
    metrics.observe_run("team-a", "gate-1", "gate", "Running", {})
    assert series(metrics, PENDING_REQUEST) == {}


def test_reconcile_series_exist_at_zero_for_every_kind_and_queue_depth_is_read_per_scrape() -> None:
    metrics = metrics_mod.Metrics()
    depth = [3]
    metrics.watch_queue(lambda: depth[0])
    scraped = scrape(metrics)
    kinds = {dict(labels)["kind"] for labels in scraped["agentflows_reconcile_errors_total"]}
    assert kinds == {"Agent", "Flow", "FlowRun", "History"}
    assert set(scraped["agentflows_reconciles_total"].values()) == {0.0}
    assert scraped["agentflows_reconcile_queue_depth"] == {(): 3.0}
    depth[0] = 0
    assert series(metrics, "agentflows_reconcile_queue_depth") == {(): 0.0}
