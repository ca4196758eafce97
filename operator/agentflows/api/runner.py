"""The runner pod of a Flow's runs: ``Flow.spec.runner``'s overrides and its files volumes.

:class:`RunnerSpec` is what a Flow may change of the pod the operator starts for each run (image,
service account, resources, extra environment, scheduling, read-only files volumes);
:mod:`agentflows.controller.pods` renders it into the pod, and the runner
(:mod:`agentflows.agents.files`) reads agents' ``path`` files under :data:`RUNNER_FILES_ROOT`.
The pod keeps to the restricted Pod Security Standard: no field here adds a host path or a
security context, nor sets one of the operator's own environment variables.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from agentflows.api import common

#: Where the runner pod's files volumes are mounted, each in a directory named after it; the
#: runner reads agents' ``path`` files here unless ``AGENTFLOWS_FILES_ROOT`` says otherwise.
RUNNER_FILES_ROOT = "/var/run/agentflows/files"
#: Where the operator mounts the ConfigMaps a run reads (its snapshot, the ``configMapKeyRef``
#: files its Agents and Flows name, the outputs earlier attempts offloaded), each key at
#: ``<name>/<key>``: the runner's identity may not ``get`` a ConfigMap, so it reads no other.
#: ``AGENTFLOWS_CONFIGMAPS_ROOT`` (the operator's prefix: a Flow cannot set it) moves it.
RUNNER_CONFIGMAPS_ROOT = "/var/run/agentflows/configmaps"
CONFIGMAPS_ROOT_ENV = "AGENTFLOWS_CONFIGMAPS_ROOT"
#: Where the runner pod's secrets volume is mounted: a file ``<Secret name>/<key>`` for each
#: Secret key the run's Flows and Agents name (read by the runner only; closed to its tools).
RUNNER_SECRETS_ROOT = "/var/run/agentflows/secrets"
#: Where the kubelet mounts a pod's service-account token (the runner's identity).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Most files volumes on one runner pod.
MAX_FILES_VOLUMES = 16
#: A files volume's name, prefixed with ``files-``, is a pod volume name (a 63-character label).
FILES_VOLUME_NAME_MAX = 57
FILES_VOLUME_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class EnvVar(common.ApiModel):
    """A plain environment variable for the runner pod (never one of the operator's own)."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": common.OPERATOR_ENV_CEL.format(name="self.name"),
                    "message": common.operator_env_message("name"),
                }
            ]
        }
    }

    name: str = Field(
        min_length=1,
        max_length=256,
        description=f"Variable name (not starting with {common.OPERATOR_ENV_PREFIX}).",
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    secret_key_ref: common.SecretKeySelector | None = Field(
        default=None, description="Value from a Secret."
    )

    @field_validator("name")
    @classmethod
    def _not_the_operators(cls, name: str) -> str:
        problem = common.operator_env_problem(name)
        if problem:
            raise ValueError(problem)
        return name


class Toleration(common.ApiModel):
    """A pod toleration."""

    key: str | None = Field(default=None, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Operator.")
    value: str | None = Field(default=None, description="Taint value.")
    effect: str | None = Field(default=None, description="Taint effect.")
    toleration_seconds: int | None = Field(
        default=None,
        ge=-common.INT_MAX,
        le=common.INT_MAX,
        description="Toleration seconds.",
    )


class ResourceRequirements(common.ApiModel):
    """CPU and memory for the runner container."""

    requests: dict[str, str] = Field(default_factory=dict, description="Requests.")
    limits: dict[str, str] = Field(default_factory=dict, description="Limits.")


class ConfigMapFiles(common.ApiModel):
    """A ConfigMap of the run's namespace whose keys become files."""

    name: common.ObjectName = Field(description="Name of the ConfigMap.")


class ClaimFiles(common.ApiModel):
    """A PersistentVolumeClaim of the run's namespace, always mounted read-only."""

    claim_name: common.ObjectName = Field(description="Name of the PersistentVolumeClaim.")
    read_only: Literal[True] = Field(
        default=True, description="Always true: the runner never writes its reference files."
    )


class FilesVolume(common.ApiModel):
    """A volume mounted read-only at ``<files root>/<name>`` for agents' ``path`` files.

    Exactly one source, a ConfigMap or a PersistentVolumeClaim: no host paths or other volume
    kinds, so the runner pod keeps to the restricted Pod Security Standard.
    """

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.configMap), has(self.persistentVolumeClaim)]"
                    ".filter(x, x).size() == 1",
                    "message": "set exactly one of configMap or persistentVolumeClaim",
                }
            ]
        }
    }

    name: str = Field(
        min_length=1,
        max_length=FILES_VOLUME_NAME_MAX,
        pattern=FILES_VOLUME_NAME_PATTERN,
        description="Directory under the files root, and (prefixed) the pod's volume name.",
    )
    config_map: ConfigMapFiles | None = Field(default=None, description="A ConfigMap's keys.")
    persistent_volume_claim: ClaimFiles | None = Field(
        default=None, description="A PersistentVolumeClaim, mounted read-only."
    )
    sub_path: common.OsText | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Mount only this relative path of the volume.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> FilesVolume:
        if (self.config_map is None) == (self.persistent_volume_claim is None):
            raise ValueError("set exactly one of configMap or persistentVolumeClaim")
        if self.sub_path is not None and (
            self.sub_path.startswith("/") or ".." in self.sub_path.split("/")
        ):
            raise ValueError(
                f"subPath {self.sub_path[:100]!r} must be a path inside the volume "
                "(no leading / and no ..)"
            )
        return self


class RunnerSpec(common.ApiModel):
    """Overrides for the runner pod."""

    model_config = common.ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.files) || self.files.all(f, "
                    "self.files.exists_one(g, g.name == f.name))",
                    "message": "files: names must be unique",
                }
            ]
        }
    }

    image: str | None = Field(default=None, max_length=1024, description="Runner image.")
    service_account_name: str | None = Field(
        default=None, max_length=253, description="Service account of the runner pod."
    )
    resources: ResourceRequirements | None = Field(default=None, description="Resources.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Extra environment."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations.")
    files: list[FilesVolume] = Field(
        default_factory=list,
        max_length=MAX_FILES_VOLUMES,
        description="Volumes mounted read-only at <files root>/<name> for agents' path files.",
    )

    @model_validator(mode="after")
    def _unique_files(self) -> RunnerSpec:
        names = [volume.name for volume in self.files]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"files: names must be unique ({', '.join(repeated)} repeated)")
        return self
