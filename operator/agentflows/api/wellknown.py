"""Every label and annotation key agentflows writes or reads on Kubernetes objects: the one list.

Labels select (runner pods, ConfigMaps and sessions by their run, Flow or memory; a CronJob by
its trigger); annotations carry what a later reader needs and a label value cannot hold (63
characters, a restricted alphabet). Values derived from a user's name go through
:func:`agentflows.kube.objects.label_value`.
"""

from __future__ import annotations

# ----- labels -------------------------------------------------------------------------------

#: Who manages an object (Kubernetes' recommended label), with :data:`MANAGER` as its value.
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "agentflows"
#: The application an object belongs to (Kubernetes' recommended label), on the policies the
#: package renders, as the chart labels what it installs.
APP_NAME = "app.kubernetes.io/name"
#: The Flow a FlowRun, runner pod, ConfigMap or CronJob belongs to.
FLOW = "agentflows.io/flow"
#: The FlowRun a runner pod or ConfigMap belongs to.
RUN = "agentflows.io/run"
#: The attempt a runner pod runs.
ATTEMPT = "agentflows.io/attempt"
#: Which offloaded output a ConfigMap holds (the part of its name after the run's).
OUTPUT = "agentflows.io/output"
#: An AgentSession's memory (a label) and session (a label, made label-safe; and an annotation,
#: as given).
MEMORY = "agentflows.io/memory"
SESSION = "agentflows.io/session"
#: The trigger (and its type) a CronJob or a FlowRun comes from.
TRIGGER = "agentflows.io/trigger"
TRIGGER_TYPE = "agentflows.io/trigger-type"

# ----- annotations --------------------------------------------------------------------------

#: On a FlowRun: the ``traceparent`` of the call that started the run.
TRACEPARENT_ANNOTATION = "agentflows.io/traceparent"
#: On a FlowRun: request id -> "created" | "decided", the request Events the operator posted.
REQUESTS_ANNOTATION = "agentflows.io/requests"
#: On an AgentSession, read by listings: when it was last written, its turns and its size.
UPDATED_ANNOTATION = "agentflows.io/updated-at"
TURNS_ANNOTATION = "agentflows.io/turns"
BYTES_ANNOTATION = "agentflows.io/bytes"
#: On a FlowRun a trigger started: what de-duplicates it, the webhook delivery, the schedule's
#: time.
DEDUP_ANNOTATION = "agentflows.io/dedup-key"
DELIVERY_ANNOTATION = "agentflows.io/delivery-id"
SCHEDULED_TIME_ANNOTATION = "agentflows.io/scheduled-time"
#: On a run a kubernetes trigger started from another run's object (its Events, its pods):
#: how many such hops led to it (see :data:`agentflows.triggers.kubernetes.MAX_TRIGGER_DEPTH`).
DEPTH_ANNOTATION = "agentflows.io/trigger-depth"
#: On a schedule trigger's CronJob: the hash of the spec it was written from.
SPEC_HASH_ANNOTATION = "agentflows.io/spec-hash"
