"""Names and labels derived from users' names: valid for Kubernetes, readable, distinct."""

from __future__ import annotations

import re

from agentflows.api import wellknown
from agentflows.kube import objects

DNS_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_short_names_and_labels_are_kept_as_they_are() -> None:
    assert objects.label_value("shout") == "shout"
    assert objects.pod_name("shout-1", 2) == "shout-1-2"
    assert objects.snapshot_name("shout-1") == "shout-1-snapshot"
    assert objects.cronjob_name("nightly", "daily") == "nightly-daily"
    assert objects.run_labels("r", "f")[wellknown.FLOW] == "f"


def test_a_long_flow_name_becomes_a_valid_label_that_keeps_its_head_and_stays_distinct() -> None:
    first = "a" * 52 + "-first-flow-name"
    second = "a" * 52 + "-other-flow-name"
    labels = [objects.label_value(first), objects.label_value(second)]
    assert [len(label) for label in labels] == [63, 63]
    assert all(DNS_LABEL_VALUE.match(label) for label in labels)
    assert labels[0] != labels[1]
    assert all(label.startswith("a" * 40) for label in labels)
    assert objects.flow_selector(first) == f"{wellknown.FLOW}={labels[0]}"


def test_names_derived_from_a_253_character_run_fit_and_keep_their_suffix() -> None:
    run = "r" * 253
    for name, suffix in (
        (objects.pod_name(run, 12), "-12"),
        (objects.snapshot_name(run), "-snapshot"),
    ):
        assert len(name) <= objects.NAME_MAX and name.endswith(suffix)
    prefix = objects.offload_prefix(run, "nodes.big")
    assert len(prefix + "-9999") <= objects.NAME_MAX
    assert objects.pod_name(run, 1) != objects.pod_name("r" * 252, 1)


def test_a_cronjob_name_is_dns_safe_and_at_most_52_characters() -> None:
    name = objects.cronjob_name("Flow_With.Caps" + "x" * 60, "every_hour")
    assert len(name) <= objects.CRONJOB_NAME_MAX
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)
