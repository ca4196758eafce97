"""Triggers without a cluster: signatures, rate limits, dedup, CronJob shape, input expressions,
selectors, and the webhook receiver against a fake API server (an httpx mock transport)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from agentflows.api import flow as flow_api
from agentflows.api import wellknown
from agentflows.triggers import common, kubernetes, schedule, signing, webhook
from tests.support.fake_kube import FakeKubeApi

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def flow_obj(*triggers: dict[str, Any], name: str = "nightly", namespace: str = "team") -> dict:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1"},
        "spec": {"nodes": [{"id": "a", "transform": "=1"}], "triggers": list(triggers)},
    }


# --- HMAC ------------------------------------------------------------------------------------


def test_signature_verifies_only_the_exact_body_and_key() -> None:
    body = b'{"ref": "main"}'
    good = signing.signature(b"key", body)
    assert good.startswith("sha256=")
    assert signing.verify_signature(b"key", body, good)
    assert not signing.verify_signature(b"key", body + b" ", good)
    assert not signing.verify_signature(b"other", body, good)
    assert not signing.verify_signature(b"key", body, None)
    assert not signing.verify_signature(b"key", body, "sha256=" + "0" * 64)
    assert not signing.verify_signature(b"key", body, "sha256=é")


# --- rate limit and dedup --------------------------------------------------------------------


def test_rate_limiter_allows_a_burst_then_refills_per_minute() -> None:
    clock = Clock()
    limiter = common.RateLimiter(clock=clock)
    assert [limiter.allow("t", 3) for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("other", 3)
    assert limiter.retry_after("t", 3) == pytest.approx(20.0)
    clock.now += 20
    assert limiter.allow("t", 3)
    assert not limiter.allow("t", 3)


def test_rate_limiter_memory_is_bounded() -> None:
    limiter = common.RateLimiter(max_keys=10)
    for index in range(100):
        limiter.allow(f"k{index}", 1)
    assert len(limiter._buckets) == 10


def test_dedup_holds_a_key_for_its_window_and_releases_failed_claims() -> None:
    clock = Clock()
    dedup = common.Deduplicator(clock=clock)
    assert dedup.claim("pod-a|BackOff", 60) is None
    dedup.settle("pod-a|BackOff", "doctor-x1")
    assert dedup.claim("pod-a|BackOff", 60) == "doctor-x1"
    assert dedup.claim("pod-b|BackOff", 60) is None
    dedup.release("pod-b|BackOff")
    assert dedup.claim("pod-b|BackOff", 60) is None
    clock.now += 61
    assert dedup.claim("pod-a|BackOff", 60) is None


def test_dedup_with_a_zero_window_never_drops_and_memory_is_bounded() -> None:
    dedup = common.Deduplicator(max_keys=5)
    assert dedup.claim("k", 0) is None
    assert dedup.claim("k", 0) is None
    for index in range(50):
        dedup.claim(f"k{index}", 600)
    assert len(dedup) <= 5


# --- CronJobs --------------------------------------------------------------------------------


def test_cronjob_for_a_schedule_trigger() -> None:
    trigger = flow_api.Trigger.model_validate(
        {
            "name": "every_night",
            "schedule": {
                "cron": "0 2 * * *",
                "timeZone": "Europe/Paris",
                "startingDeadlineSeconds": 120,
                "suspend": True,
            },
        }
    )
    job = schedule.cronjob_for(flow_obj(), trigger, schedule.Settings(image="img:1"))
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"].startswith("nightly-every-night-") and len(meta["name"]) <= 52
    assert meta["ownerReferences"][0] == {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "name": "nightly",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert meta["labels"][wellknown.FLOW] == "nightly"
    assert meta["labels"][wellknown.TRIGGER] == "every_night"
    assert spec["schedule"] == "0 2 * * *"
    assert spec["timeZone"] == "Europe/Paris"
    assert spec["startingDeadlineSeconds"] == 120
    assert spec["suspend"] is True
    assert spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentflows-trigger"
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"] == [
        "agentflows",
        "trigger",
        "--flow",
        "team/nightly",
        "--trigger",
        "every_night",
    ]
    security = container["securityContext"]
    assert security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_cronjob_names_are_short_safe_and_distinct() -> None:
    assert schedule.cronjob_name("web", "nightly") == "web-nightly"
    long_a = schedule.cronjob_name("f" * 60, "a")
    long_b = schedule.cronjob_name("f" * 60, "b")
    assert len(long_a) <= 52 and len(long_b) <= 52 and long_a != long_b
    assert schedule.cronjob_name("web", "a_b") != schedule.cronjob_name("web", "a-b")


def test_a_changed_schedule_changes_the_spec_hash() -> None:
    def hashed(cron: str) -> str:
        trigger = flow_api.Trigger.model_validate({"name": "t", "schedule": {"cron": cron}})
        job = schedule.cronjob_for(flow_obj(), trigger, schedule.Settings())
        return str(job["metadata"]["annotations"][wellknown.SPEC_HASH_ANNOTATION])

    assert hashed("* * * * *") == hashed("* * * * *") != hashed("*/5 * * * *")


def test_scheduled_time_is_decoded_from_the_job_name() -> None:
    assert schedule.scheduled_time_of("nightly-t-29412345", "nightly-t") == "2025-12-03T05:45:00Z"
    assert schedule.scheduled_time_of("manual-1", "nightly-t") is None
    assert schedule.scheduled_time_of("nightly-t-now", "nightly-t") is None
    assert schedule.scheduled_time_of(None, "nightly-t") is None


# --- the FlowRun a trigger creates ------------------------------------------------------------


def test_triggered_flowrun_carries_labels_trigger_and_evaluated_input() -> None:
    trigger = flow_api.Trigger.model_validate(
        {
            "name": "nightly",
            "schedule": {"cron": "0 2 * * *"},
            "input": {"when": "=.run.trigger.scheduledTime", "kind": "{{ .run.trigger.type }}"},
        }
    )
    request = common.RunRequest(
        payload={"scheduledTime": "2026-01-01T02:00:00Z"},
        extra={"scheduledTime": "2026-01-01T02:00:00Z"},
        annotations={wellknown.SCHEDULED_TIME_ANNOTATION: "2026-01-01T02:00:00Z"},
    )
    body = common.flowrun_body(flow_obj(), trigger, request)
    assert body["metadata"]["generateName"] == "nightly-"
    assert body["metadata"]["labels"] == {
        "agentflows.io/flow": "nightly",
        "agentflows.io/trigger": "nightly",
        "agentflows.io/trigger-type": "schedule",
        "app.kubernetes.io/managed-by": "agentflows",
    }
    assert body["spec"]["input"] == {"when": "2026-01-01T02:00:00Z", "kind": "schedule"}
    assert body["spec"]["trigger"] == {
        "type": "schedule",
        "name": "nightly",
        "payload": {"scheduledTime": "2026-01-01T02:00:00Z"},
    }


def test_a_failing_input_expression_is_a_trigger_error() -> None:
    trigger = flow_api.Trigger.model_validate(
        {"name": "h", "webhook": {"secret": {"name": "s", "key": "k"}}, "input": '=error("x")'}
    )
    with pytest.raises(common.TriggerError, match="trigger h input"):
        common.flowrun_body(flow_obj(), trigger, common.RunRequest(payload={}))


# --- kubernetes triggers: selectors, identity, trimming ------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", True),
        ("app==web,tier!=db", True),
        ("app in (web, api)", True),
        ("app notin (web)", False),
        ("tier", False),
        ("!tier", True),
        ("app=api", False),
        ("", True),
    ],
)
def test_label_selectors_match_like_the_api_server(selector: str, expected: bool) -> None:
    assert kubernetes.label_selector_matches(selector, {"app": "web"}) is expected


def test_field_selectors_read_dotted_paths() -> None:
    event = {"reason": "BackOff", "involvedObject": {"kind": "Pod", "name": "web-0"}}
    assert kubernetes.field_selector_matches("involvedObject.kind=Pod,reason=BackOff", event)
    assert not kubernetes.field_selector_matches("reason!=BackOff", event)
    assert not kubernetes.field_selector_matches("involvedObject.kind=Node", event)


def test_events_about_one_pod_share_an_identity() -> None:
    def event(name: str, reason: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "uid": name},
            "reason": reason,
            "involvedObject": {"kind": "Pod", "name": "web-0", "uid": "pod-uid"},
        }

    key = ("v1", "Event")
    first = kubernetes.dedup_identity(key, "ADDED", event("e1", "BackOff"))
    assert first == kubernetes.dedup_identity(key, "MODIFIED", event("e2", "BackOff"))
    assert first != kubernetes.dedup_identity(key, "ADDED", event("e3", "Failed"))


def test_trim_keeps_identity_and_what_happened() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e", "namespace": "n", "uid": "u", "managedFields": [{}]},
        "reason": "BackOff",
        "message": "x" * 10_000,
        "involvedObject": {"name": "web-0"},
    }
    trimmed = kubernetes.trim(obj)
    assert "managedFields" not in trimmed["metadata"]
    assert len(trimmed["message"]) == kubernetes.MAX_MESSAGE
    assert trimmed["involvedObject"] == {"name": "web-0"}


def test_the_cluster_doctor_example_trigger_compiles_and_maps_the_event() -> None:
    docs = yaml.safe_load_all((REPO / "examples/cluster-doctor/flow.yaml").read_text())
    flow = next(d for d in docs if d["kind"] == "Flow")
    flow["metadata"].update(namespace="ops", uid="u")
    (trigger,) = common.triggers_of(flow)
    common.check_expressions(trigger)
    payload = {
        "type": "ADDED",
        "object": {"involvedObject": {"name": "web-0", "namespace": "shop"}, "reason": "BackOff"},
    }
    body = common.flowrun_body(flow, trigger, common.RunRequest(payload=payload))
    assert body["spec"]["input"] == {"pod": "web-0", "namespace": "shop"}


# --- the webhook receiver against a fake API server -------------------------------------------


def hooked_api() -> FakeKubeApi:
    """One Flow ``ci`` with the webhook trigger ``push`` (key ``k``), rate limit 3 per minute."""
    fake = FakeKubeApi()
    fake.flows.append(
        flow_obj(
            {
                "name": "push",
                "webhook": {"secret": {"name": "hook", "key": "hmac"}},
                "input": {"ref": "=.run.trigger.payload.ref"},
                "rateLimitPerMinute": 3,
            },
            name="ci",
        )
    )
    fake.secrets["hook"] = {"hmac": b"k"}
    return fake


@pytest.fixture
async def receiver() -> Any:
    fake = hooked_api()
    api = await fake.client()
    async with TestClient(TestServer(webhook.make_app(api))) as test_client:
        for _ in range(100):
            if (await test_client.get("/readyz")).status == 200:
                break
        yield test_client, fake
    await api.close()
    await fake.close()


def signed(body: bytes, key: bytes = b"k", **headers: str) -> dict[str, str]:
    return {signing.SIGNATURE_HEADER: signing.signature(key, body), **headers}


async def test_webhook_accept_and_reject_matrix(receiver: Any) -> None:
    test_client, fake = receiver
    url = "/hooks/team/ci/push"
    body = b'{"ref": "main"}'
    ok = await test_client.post(url, data=body, headers=signed(body, **{"X-GitHub-Delivery": "d1"}))
    assert ok.status == 202
    assert (await ok.json())["flowRun"] == "ci-0"
    assert fake.created[0]["spec"]["input"] == {"ref": "main"}
    assert fake.created[0]["metadata"]["annotations"] == {wellknown.DELIVERY_ANNOTATION: "d1"}

    replay = await test_client.post(
        url, data=body, headers=signed(body, **{"X-GitHub-Delivery": "d1"})
    )
    assert replay.status == 200 and (await replay.json()) == {"flowRun": "ci-0", "duplicate": True}

    assert (await test_client.post(url, data=body)).status == 401
    assert (await test_client.post(url, data=body, headers=signed(body, key=b"bad"))).status == 401
    assert (await test_client.post(url, data=b"{", headers=signed(b"{"))).status == 400
    big = b"[" + b"1," * (webhook.MIB // 2) + b"1]"
    assert (await test_client.post(url, data=big, headers=signed(big))).status == 413
    assert (
        await test_client.post("/hooks/team/ci/nope", data=body, headers=signed(body))
    ).status == 401
    assert (
        await test_client.post("/hooks/team/nope/push", data=body, headers=signed(body))
    ).status == 401

    bodies = [json.dumps({"ref": f"r{i}"}).encode() for i in range(3)]
    codes = [(await test_client.post(url, data=b, headers=signed(b))).status for b in bodies]
    assert codes == [202, 202, 429]
    assert len(fake.created) == 3

    metrics = await (await test_client.get("/metrics")).text()
    assert (
        'agentflows_webhook_requests_total{code="202",flow="ci",namespace="team",trigger="push"} 3.0'
        in metrics
    )
    assert 'code="401",flow="",namespace="",trigger=""' in metrics
    assert (await test_client.get("/healthz")).status == 200


async def test_refused_signatures_are_counted_by_trigger_and_reason(receiver: Any) -> None:
    test_client, _ = receiver
    body = b'{"ref": "main"}'
    for _ in range(2):
        bad = await test_client.post("/hooks/team/ci/push", data=body, headers=signed(body, b"x"))
        assert bad.status == 401
    unknown = await test_client.post("/hooks/team/ci/nope", data=body, headers=signed(body))
    assert unknown.status == 401

    metrics = await (await test_client.get("/metrics")).text()
    failures = "agentflows_webhook_signature_failures_total"
    assert (
        f'{failures}{{flow="ci",namespace="team",reason="bad_signature",trigger="push"}} 2.0'
        in metrics
    )
    assert f'{failures}{{flow="",namespace="",reason="unknown_trigger",trigger=""}} 1.0' in metrics


async def test_a_chunked_body_over_the_limit_is_refused(receiver: Any) -> None:
    test_client, _ = receiver

    async def chunks() -> Any:
        for _ in range(20):
            yield b" " * 65_536

    response = await test_client.post("/hooks/team/ci/push", data=chunks())
    assert response.status == 413
