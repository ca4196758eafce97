"""The Flows page's triggers: when each schedule fires next, and where each webhook is posted."""

from __future__ import annotations

import datetime
from typing import Any

from agentflows.console import pages_flows

#: A Friday morning: the next weekday 09:00 in Paris is Monday's.
FRIDAY = datetime.datetime(2026, 12, 4, 10, 0, tzinfo=datetime.UTC)


def _flow(*triggers: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": "deploy"},
        "spec": {"nodes": [{"id": "a", "transform": "=1"}], "triggers": list(triggers)},
    }


def test_a_schedule_trigger_shows_when_it_fires_next_in_its_time_zone_and_in_utc() -> None:
    flow = _flow(
        {"name": "weekdays", "schedule": {"cron": "0 9 * * 1-5", "timeZone": "Europe/Paris"}},
        {"name": "hourly", "schedule": {"cron": "@hourly"}},
    )
    shown = str(pages_flows.triggers(flow, "", FRIDAY))
    assert "schedule 0 9 * * 1-5 (Europe/Paris); next: 2026-12-07 09:00 CET (08:00 UTC)" in shown
    assert "schedule @hourly (UTC); next: 2026-12-04 11:00 UTC (11:00 UTC)" in shown


def test_a_schedule_that_cannot_be_read_says_why_instead_of_a_time() -> None:
    flow = _flow({"name": "odd", "schedule": {"cron": "0 9 * *", "timeZone": "Mars/Olympus"}})
    shown = str(pages_flows.triggers(flow, "", FRIDAY))
    assert "next: unknown, unknown time zone &#x27;Mars/Olympus&#x27;" in shown


def test_a_webhook_trigger_shows_its_url_under_the_receivers_address_else_its_path() -> None:
    flow = _flow({"name": "push", "webhook": {"secretRef": {"name": "hook-key"}}})
    under = str(pages_flows.triggers(flow, "https://hooks.example.org/", FRIDAY))
    assert "webhook POST https://hooks.example.org/hooks/team-a/deploy/push" in under
    alone = str(pages_flows.triggers(flow, "", FRIDAY))
    assert "webhook POST /hooks/team-a/deploy/push<" in alone
