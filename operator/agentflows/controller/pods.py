"""The runner pod spec: a pure function of the run, its snapshot and the operator settings.

Called by :mod:`agentflows.controller.flowruns` for each attempt. The pod runs
``agentflows runner --namespace NS --flowrun NAME`` with a restricted security context, owned by
the FlowRun, ``restartPolicy: Never`` (retries are the operator's attempts, each a new pod).
The Secrets its Flows and Agents name reach it only as the files of one projected volume
(:func:`secrets_volume`, mode 0440, mounted read-only at
:data:`agentflows.api.runner.RUNNER_SECRETS_ROOT`), never as environment variables, which every
process ``kubectl exec`` starts in the container would inherit; the runner reads them, its tools
cannot (:mod:`agentflows.agents.containment`). The operator never reads a value. A Flow's own
``runner.env`` ``secretKeyRef``s stay environment variables: the Flow asked for those. The
ConfigMaps it reads (its snapshot, reference files, offloaded outputs) are one projected volume
(:func:`config_map_volume`): the runner's identity may not read a ConfigMap itself.
"""

from __future__ import annotations

from typing import Any

from agentflows import api as api_group
from agentflows import tracing
from agentflows.api import agent as agent_api
from agentflows.api import budget as budget_api
from agentflows.api import common, references, wellknown
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import runner as runner_api
from agentflows.controller import resolve, settings
from agentflows.kube import mounted, objects, podsecurity, status_store
from agentflows.kube import snapshot as kube_snapshot

CONTAINER = "runner"
DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


SECRETS_VOLUME = "secrets"
#: Owner and group may read (the group is the pod's ``fsGroup``, the runner's own gid).
SECRETS_MODE = 0o440


def secret_refs(
    flows: dict[str, flow_api.FlowSpec], agents: dict[str, agent_api.AgentSpec]
) -> dict[str, set[str]]:
    """The keys of each Secret the run's Flows and Agents name (not the Flow's ``runner.env``)."""
    refs: dict[str, set[str]] = {}
    for flow_spec in flows.values():
        for path, ref in resolve.flow_secret_refs(flow_spec):
            if not path.startswith("spec.runner.env"):
                refs.setdefault(ref.name, set()).add(ref.key)
    for agent_spec in agents.values():
        for _, ref in resolve.agent_secret_refs(agent_spec):
            refs.setdefault(ref.name, set()).add(ref.key)
    return refs


def secrets_volume(refs: dict[str, set[str]]) -> dict[str, Any] | None:
    """The projected volume of ``refs``: the file ``<name>/<key>`` per key (None: no Secret)."""
    if not refs:
        return None
    sources = [
        {
            "secret": {
                "name": name,
                "items": [{"key": key, "path": f"{name}/{key}"} for key in sorted(keys)],
            }
        }
        for name, keys in sorted(refs.items())
    ]
    return {
        "name": SECRETS_VOLUME,
        "projected": {"defaultMode": SECRETS_MODE, "sources": sources},
    }


#: The verb a run's Role grants on ``<run>/<memory>``: the runner policy asks the authorizer
#: for it before a runner writes an AgentSession (``config/policies/runner_own_run.yaml``).
SESSIONS_VERB = "write"


def sessions_grant(
    pod: dict[str, Any], owner: dict[str, Any], memories: list[str]
) -> list[dict[str, Any]]:
    """The Role and RoleBinding letting ``pod``'s run write the sessions of ``memories``.

    RBAC cannot name the memories a run's Agents name (a session's name is known only at run
    time, and every run shares one ServiceAccount), so the Role grants a verb of our own,
    :data:`SESSIONS_VERB`, on the resource names ``<run>/<memory>``, where ``<run>`` is the pod
    name without its ``-<attempt>`` as the policy reads it from the pod-bound token. The policy
    asks the authorizer whether the caller may ``write`` ``<its run>/<the session's memory>``:
    only this run's Role says yes. Owned by the FlowRun (garbage-collected with it). Empty
    when the run writes no memory.
    """
    if not memories:
        return []
    meta = pod["metadata"]
    run = str(meta["name"]).rsplit("-", 1)[0]
    name = objects.derived(run, "-agentflows-sessions")
    labels = {k: v for k, v in meta["labels"].items() if k in (wellknown.RUN, wellknown.FLOW)}
    common_meta = {
        "name": name,
        "namespace": meta["namespace"],
        "labels": {wellknown.MANAGED_BY: wellknown.MANAGER, **labels},
        "ownerReferences": [objects.owner_reference(owner, controller=False, block=False)],
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": common_meta,
        "rules": [
            {
                "apiGroups": [api_group.GROUP],
                "resources": ["agentsessions"],
                "verbs": [SESSIONS_VERB],
                "resourceNames": [f"{run}/{memory}" for memory in sorted(memories)],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": common_meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": pod["spec"]["serviceAccountName"],
                "namespace": meta["namespace"],
            }
        ],
    }
    return [role, binding]


def runner_env(spec: runner_api.RunnerSpec) -> list[dict[str, Any]]:
    """The Flow's ``runner.env`` as container env, without a variable of the operator's.

    The models and the CRD refuse such a name; one stored before that rule existed is left out
    here, and the operator's variables come after the Flow's anyway (the last of a name wins).
    """
    env: list[dict[str, Any]] = []
    for var in spec.env:
        if common.operator_env_problem(var.name):
            continue
        if var.secret_key_ref is not None:
            ref = var.secret_key_ref
            env.append(
                {
                    "name": var.name,
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
                }
            )
        else:
            env.append({"name": var.name, "value": var.value or ""})
    return env


def files_volumes(spec: runner_api.RunnerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Flow's ``runner.files`` as (volumes, read-only mounts under the files root)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for entry in spec.files:
        volume: dict[str, Any] = {"name": f"files-{entry.name}"}
        if entry.config_map is not None:
            volume["configMap"] = {"name": entry.config_map.name}
        elif entry.persistent_volume_claim is not None:
            claim = entry.persistent_volume_claim.claim_name
            volume["persistentVolumeClaim"] = {"claimName": claim, "readOnly": True}
        mount = {
            "name": volume["name"],
            "mountPath": f"{runner_api.RUNNER_FILES_ROOT}/{entry.name}",
            "readOnly": True,
        }
        if entry.sub_path is not None:
            mount["subPath"] = entry.sub_path
        volumes.append(volume)
        mounts.append(mount)
    return volumes, mounts


def config_map_volume(
    run: dict[str, Any],
    status: flowrun_api.FlowRunStatus,
    flows: dict[str, flow_api.FlowSpec],
    agents: dict[str, agent_api.AgentSpec],
) -> dict[str, Any]:
    """The ConfigMaps the run reads, as one projected volume (:mod:`agentflows.kube.mounted`).

    The snapshot is required; the keys ``files[].configMapKeyRef`` name and the parts of the
    values ``status`` holds offloaded are optional (their absence is the node's or the run's
    error, with the message the runner always gave).
    """
    named: list[references.Reference] = []
    for flow_spec in flows.values():
        named += references.flow_references(flow_spec)
    for agent_spec in agents.values():
        named += references.agent_references(agent_spec)
    files = [
        (ref.name, ref.key)
        for ref in named
        if ref.kind == references.CONFIG_MAP and ref.for_runner and ref.key
    ]
    offloaded = status_store.offloaded_parts(status)
    snapshot = (objects.snapshot_name(run["metadata"]["name"]), kube_snapshot.SNAPSHOT_KEY)
    return mounted.volume([snapshot], [*files, *offloaded])


def runner_pod(
    run: dict[str, Any],
    attempt: int,
    flow_name: str,
    flows: dict[str, flow_api.FlowSpec],
    agents: dict[str, agent_api.AgentSpec],
    config: settings.OperatorConfig,
    *,
    status: flowrun_api.FlowRunStatus,
    deadline_seconds: int | None = None,
    budget: budget_api.RunBudget | None = None,
) -> dict[str, Any]:
    """The pod of ``attempt`` of ``run``.

    ``status`` is the run's (the operator's cache keeps it parsed, not in ``run``): the
    ConfigMaps of its offloaded values are mounted. ``deadline_seconds`` is what remains of
    the timeout, ``budget`` what the namespace's Budgets let the run use
    (``$AGENTFLOWS_BUDGET``).
    """
    meta = run["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    flow_spec = flows[flow_name]
    runner = flow_spec.runner
    pod_labels = {**objects.run_labels(name, flow_name), wellknown.ATTEMPT: str(attempt)}
    env = [
        *runner_env(runner),
        {"name": "LITELLM_LOCAL_MODEL_COST_MAP", "value": "True"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "AGENTFLOWS_ATTEMPT", "value": str(attempt)},
        *(
            [
                {
                    "name": budget_api.RUN_BUDGET_ENV,
                    "value": budget.model_dump_json(exclude_none=True),
                }
            ]
            if budget is not None
            else []
        ),
        *tracing.pod_env(),
    ]
    resources = runner.resources.model_dump() if runner.resources else DEFAULT_RESOURCES
    volumes, mounts = files_volumes(runner)
    secrets_source = secrets_volume(secret_refs(flows, agents))
    if secrets_source is not None:
        volumes.append(secrets_source)
        mounts.append(
            {
                "name": SECRETS_VOLUME,
                "mountPath": runner_api.RUNNER_SECRETS_ROOT,
                "readOnly": True,
            }
        )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": runner.image or config.runner_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["agentflows", "runner", "--namespace", namespace, "--flowrun", name],
        "env": env,
        "resources": {k: v for k, v in resources.items() if v},
        "securityContext": podsecurity.container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, mounted.mount(), *mounts],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": runner.service_account_name or config.runner_service_account,
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "securityContext": podsecurity.pod_security_context(fs_group=True),
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            config_map_volume(run, status, flows, agents),
            *volumes,
        ],
    }
    if runner.node_selector:
        spec["nodeSelector"] = dict(runner.node_selector)
    if runner.tolerations:
        spec["tolerations"] = [t.to_wire() for t in runner.tolerations]
    if deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = max(1, deadline_seconds)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": objects.pod_name(name, attempt),
            "namespace": namespace,
            "labels": pod_labels,
            "ownerReferences": [objects.owner_reference(run)],
        },
        "spec": spec,
    }
