"""Schedule triggers: one CronJob per trigger, owned by the Flow, and the command its pod runs.

The operator calls :func:`sync_cronjobs` from its Flow handler; it creates, updates and deletes
the Flow's CronJobs so they match the Flow's ``schedule`` triggers (idempotent, safe to call
on every change). Deleting the Flow deletes its CronJobs through their ownerReference.

Each CronJob's pod runs ``agentflows trigger --flow NS/NAME --trigger T`` (:func:`fire`) as the
``agentflows-trigger`` service account, which may only get Flows and create FlowRuns.

The scheduled time: Kubernetes does not hand it to the pod, but the CronJob controller names
each Job ``<cronjob>-<minutes since the epoch of the scheduled time>`` and the Job controller
labels its pods ``batch.kubernetes.io/job-name``. The pod gets that label through the downward
API (env ``AGENTFLOWS_JOB_NAME``, next to ``AGENTFLOWS_CRONJOB``) and :func:`scheduled_time_of`
decodes it: no extra RBAC (reading the Job's ``cronjob-scheduled-timestamp`` annotation would
need ``get jobs``). The FlowRun is named after the Job, so a retried pod (``backoffLimit``) finds
its run already there and makes no second one. A Job made by hand from the CronJob
(``kubectl create job --from=cronjob/...``) has another name: its run gets a generated name and
the time it ran.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import zoneinfo
from collections.abc import Mapping
from typing import Any

import croniter

from agentflows import api as api_group
from agentflows.api import flow as flow_api
from agentflows.api import times, wellknown
from agentflows.kube import client as kube
from agentflows.kube import objects, podsecurity
from agentflows.triggers import common

SERVICE_ACCOUNT = "agentflows-trigger"
JOB_NAME_ENV = "AGENTFLOWS_JOB_NAME"
CRONJOB_ENV = "AGENTFLOWS_CRONJOB"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the operator wants trigger CronJobs built."""

    image: str = "agentflows:0.1.0"
    service_account: str = SERVICE_ACCOUNT
    successful_jobs_history_limit: int = 3
    failed_jobs_history_limit: int = 3
    #: Pod retries of one firing (the FlowRun's fixed name keeps retries from duplicating it).
    backoff_limit: int = 3
    active_deadline_seconds: int = 300
    ttl_seconds_after_finished: int = 3600

    @classmethod
    def from_env(cls) -> Settings:
        """Image from ``$AGENTFLOWS_TRIGGER_IMAGE``, else ``$AGENTFLOWS_RUNNER_IMAGE``."""
        image = os.environ.get("AGENTFLOWS_TRIGGER_IMAGE") or os.environ.get(
            "AGENTFLOWS_RUNNER_IMAGE"
        )
        return cls(image=image) if image else cls()


def cronjob_name(flow: str, trigger: str) -> str:
    """``<flow>-<trigger>``, made DNS-safe and shortened with a hash suffix to <= 52 chars."""
    return objects.cronjob_name(flow, trigger)


def _labels(flow: str, trigger: str) -> dict[str, str]:
    return {
        wellknown.MANAGED_BY: wellknown.MANAGER,
        wellknown.FLOW: objects.label_value(flow),
        wellknown.TRIGGER: trigger,
        wellknown.TRIGGER_TYPE: "schedule",
    }


def _pod_spec(namespace: str, flow: str, trigger: str, settings: Settings) -> dict[str, Any]:
    container = {
        "name": "trigger",
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["agentflows", "trigger", "--flow", f"{namespace}/{flow}", "--trigger", trigger],
        "env": [
            {
                "name": JOB_NAME_ENV,
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}
                },
            },
            {"name": CRONJOB_ENV, "value": cronjob_name(flow, trigger)},
            {"name": "HOME", "value": "/tmp"},
        ],
        "resources": {
            "requests": {"cpu": "10m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": podsecurity.container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "securityContext": podsecurity.pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
    }


def cronjob_for(
    flow_obj: Mapping[str, Any], trigger: flow_api.Trigger, settings: Settings
) -> dict[str, Any]:
    """The CronJob of one schedule trigger (pure: no API calls)."""
    schedule = trigger.schedule
    if schedule is None:
        raise common.TriggerError(f"trigger {trigger.name} is not a schedule")
    meta = flow_obj["metadata"]
    flow, namespace = meta["name"], meta["namespace"]
    labels = _labels(flow, trigger.name)
    spec: dict[str, Any] = {
        "schedule": schedule.cron,
        "concurrencyPolicy": "Forbid",
        "suspend": schedule.suspend,
        "successfulJobsHistoryLimit": settings.successful_jobs_history_limit,
        "failedJobsHistoryLimit": settings.failed_jobs_history_limit,
        "jobTemplate": {
            "metadata": {"labels": labels},
            "spec": {
                "backoffLimit": settings.backoff_limit,
                "activeDeadlineSeconds": settings.active_deadline_seconds,
                "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(namespace, flow, trigger.name, settings),
                },
            },
        },
    }
    # Explicit nulls, so a merge patch removes a time zone or deadline taken out of the Flow.
    spec["timeZone"] = schedule.time_zone
    spec["startingDeadlineSeconds"] = schedule.starting_deadline_seconds
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": cronjob_name(flow, trigger.name),
            "namespace": namespace,
            "labels": labels,
            "annotations": {wellknown.SPEC_HASH_ANNOTATION: digest},
            "ownerReferences": [
                objects.owner_reference(
                    {"apiVersion": api_group.API_VERSION, "kind": "Flow", "metadata": meta}
                )
            ],
        },
        "spec": spec,
    }


def _without_nulls(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if v is not None}


async def sync_cronjobs(
    client: kube.Client, flow_obj: Mapping[str, Any], settings: Settings | None = None
) -> list[str]:
    """Make the Flow's CronJobs match its schedule triggers; return the CronJob names.

    Creates missing CronJobs, patches those whose spec changed (by a hash annotation),
    deletes those of removed triggers. CronJobs not owned by this Flow are never touched.
    Raises TriggerError for an invalid trigger (nothing is changed then) and
    ``kube.ApiError`` for API failures (retryable ones say so).
    """
    settings = settings or Settings.from_env()
    meta = flow_obj["metadata"]
    namespace, flow, uid = meta["namespace"], meta["name"], meta["uid"]
    desired = {
        body["metadata"]["name"]: body
        for body in (
            cronjob_for(flow_obj, trigger, settings)
            for trigger in common.triggers_of(flow_obj)
            if trigger.schedule is not None
        )
    }
    if meta.get("deletionTimestamp"):
        desired = {}
    path = kube.path_of("cronjobs", namespace)
    selector = (
        f"{objects.flow_selector(flow)},{wellknown.TRIGGER_TYPE}=schedule,"
        f"{wellknown.MANAGED_BY}={wellknown.MANAGER}"
    )
    existing = {
        item["metadata"]["name"]: item
        for item in (await client.get(path, labelSelector=selector)).get("items", [])
        if objects.owned_by(item, uid)
    }
    for name, body in desired.items():
        current = existing.get(name)
        if current is None:
            created = dict(body, spec=_without_nulls(body["spec"]))
            await objects.create_or_get(client, path, created)
            continue
        annotations = current["metadata"].get("annotations") or {}
        if annotations.get(wellknown.SPEC_HASH_ANNOTATION) != body["metadata"]["annotations"][
            wellknown.SPEC_HASH_ANNOTATION
        ] or not objects.owned_by(current, uid):
            patch = {
                "metadata": {
                    "labels": body["metadata"]["labels"],
                    "annotations": body["metadata"]["annotations"],
                },
                "spec": body["spec"],
            }
            await client.merge_patch(f"{path}/{name}", patch)
    for name in existing.keys() - desired.keys():
        await client.delete(f"{path}/{name}", propagation="Background")
    return sorted(desired)


def scheduled_time_of(job_name: str | None, cronjob: str | None) -> str | None:
    """The scheduled time (RFC 3339, UTC) in the name of a Job the CronJob controller made.

    None for any other Job, e.g. ``kubectl create job --from=cronjob/...`` under another name.
    """
    if not job_name or not cronjob or not job_name.startswith(f"{cronjob}-"):
        return None
    suffix = job_name[len(cronjob) + 1 :]
    if not suffix.isdigit():
        return None
    moment = datetime.datetime.fromtimestamp(int(suffix) * 60, tz=datetime.UTC)
    return times.api_time(moment)


def next_time(cron: str, time_zone: str | None, after: datetime.datetime) -> datetime.datetime:
    """When a schedule next fires after ``after``, in its time zone (UTC when none is given).

    Raises ValueError with the reason for a cron expression or time zone that cannot be read.
    """
    try:
        zone = zoneinfo.ZoneInfo(time_zone or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {time_zone!r}") from None
    try:
        return croniter.croniter(cron, after.astimezone(zone)).get_next(datetime.datetime)
    except (croniter.CroniterError, ValueError) as exc:
        raise ValueError(f"cron {cron!r} cannot be read: {exc}") from None


async def fire(
    client: kube.Client,
    namespace: str,
    flow: str,
    trigger_name: str,
    *,
    job_name: str | None = None,
    cronjob: str | None = None,
) -> dict[str, Any]:
    """Create the FlowRun of one firing of a schedule trigger (what ``agentflows trigger`` does).

    When ``job_name`` is a Job the ``cronjob`` controller made, the run is named after it and its
    scheduled time is decoded from it; otherwise (a run by hand) the run gets a generated name
    and the current time.
    """
    try:
        flow_obj: dict[str, Any] = await client.get(kube.path_of("flows", namespace, flow))
    except kube.ApiError as exc:
        if exc.not_found:
            raise common.TriggerError(f"flow {namespace}/{flow} not found") from exc
        raise
    trigger = common.find_trigger(flow_obj, trigger_name)
    if trigger.schedule is None:
        raise common.TriggerError(
            f"trigger {trigger_name} of flow {namespace}/{flow} is a "
            f"{common.type_of(trigger)} trigger, not a schedule"
        )
    scheduled = scheduled_time_of(job_name, cronjob)
    when = scheduled or times.api_time()
    request = common.RunRequest(
        payload={"scheduledTime": when},
        extra={"scheduledTime": when},
        name=job_name if scheduled else None,
        annotations={wellknown.SCHEDULED_TIME_ANNOTATION: when},
    )
    return await common.create_run(client, flow_obj, trigger, request)


async def run_trigger_command(
    flow_ref: str, trigger_name: str, kubeconfig: str | None, context: str | None = None
) -> str:
    """``agentflows trigger``: fire once; return the FlowRun's name (or generateName)."""
    namespace, _, flow = flow_ref.rpartition("/")
    if not namespace or not flow:
        raise common.TriggerError(f"--flow must be NAMESPACE/NAME, got {flow_ref!r}")
    async with kube.Client.from_env(kubeconfig, context, retry_seconds=60) as client:
        run = await fire(
            client,
            namespace,
            flow,
            trigger_name,
            job_name=os.environ.get(JOB_NAME_ENV),
            cronjob=os.environ.get(CRONJOB_ENV),
        )
    meta = run["metadata"]
    return str(meta.get("name") or meta.get("generateName"))
