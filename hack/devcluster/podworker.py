"""One pod's life on the process kubelet: run its containers as processes and report its status.

Created by :mod:`devcluster.kubelet` for each pod bound to its Node, one thread per pod. The
worker prepares the pod's files (:mod:`devcluster.podfiles`), runs the init containers one after
the other, then every container at once, each as a local process in its own process group with
its output appended to ``<pod dir>/<container>.log``. It writes the pod's status the way a kubelet
does (phase Pending -> Running -> Succeeded/Failed, the standard conditions, containerStatuses with
running/terminated states, exit codes and reasons), restarts containers as ``restartPolicy`` says,
enforces ``activeDeadlineSeconds``, and on deletion sends SIGTERM, waits the grace period, sends
SIGKILL and removes the pod from the API with a zero grace period.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from devcluster import podfiles

log = logging.getLogger("kubelet.pod")

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
_POLL_SECONDS = 0.2
_MAX_BACKOFF_SECONDS = 10.0
_MERGE_PATCH = "application/merge-patch+json"


def now() -> str:
    """Return the current time in the API's RFC 3339 form."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    """A container of the pod and its current process, if any."""

    spec: client.V1Container
    log_path: Path
    pid_path: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "PodInitializing"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_at: float | None = None
    done: bool = False

    @property
    def name(self) -> str:
        """The container's name."""
        return str(self.spec.name)

    def status(self) -> dict[str, Any]:
        """Return the container's entry for ``containerStatuses``."""
        running = "running" in self.state
        entry: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.image or "",
            "imageID": "",
            "ready": running,
            "started": running,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.process is not None:
            entry["containerID"] = f"process://{self.process.pid}"
        return entry


class PodWorker(threading.Thread):
    """Run one pod to its end, or until it is deleted or the kubelet stops."""

    def __init__(self, cluster: podfiles.Cluster, pod: client.V1Pod, on_finished: Any) -> None:
        super().__init__(name=f"pod-{pod.metadata.namespace}/{pod.metadata.name}", daemon=True)
        self.cluster = cluster
        self.pod = pod
        self.files = podfiles.PodFiles(cluster, pod)
        self._on_finished = on_finished
        self._deletion = threading.Event()
        self._shutdown = threading.Event()
        self._grace_seconds = 30
        self._start_time = (
            pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ")
            if pod.status and pod.status.start_time
            else now()
        )
        self._started_monotonic = time.monotonic()
        directory = self.files.directory
        self.init_containers = [
            Container(c, directory / f"{c.name}.log", directory / f"{c.name}.pid")
            for c in pod.spec.init_containers or []
        ]
        self.containers = [
            Container(c, directory / f"{c.name}.log", directory / f"{c.name}.pid")
            for c in pod.spec.containers
        ]
        self._conditions: dict[str, tuple[str, str | None]] = {"PodScheduled": ("True", None)}
        self._last_status: dict[str, Any] | None = None
        self._deleted = False

    # ----- signals from the kubelet ------------------------------------------------------------

    def request_deletion(self, grace_seconds: int | None) -> None:
        """Stop the pod within ``grace_seconds``: it has a deletionTimestamp."""
        if grace_seconds is not None:
            self._grace_seconds = grace_seconds
        self._deletion.set()

    def shutdown(self) -> None:
        """End the processes without touching the API (the kubelet is stopping)."""
        self._shutdown.set()

    def _interrupted(self) -> bool:
        return self._deletion.is_set() or self._shutdown.is_set()

    # ----- status ------------------------------------------------------------------------------

    def _report(self, phase: str, reason: str | None = None, message: str | None = None) -> None:
        if self._shutdown.is_set():
            return
        ready = phase == RUNNING and all("running" in c.state for c in self.containers)
        initialized = all(c.done for c in self.init_containers)
        self._conditions["Initialized"] = ("True" if initialized else "False", None)
        completed = "PodCompleted" if phase in (SUCCEEDED, FAILED) else None
        self._conditions["ContainersReady"] = ("True" if ready else "False", completed)
        self._conditions["Ready"] = ("True" if ready else "False", completed)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [
                {
                    "type": kind,
                    "status": value,
                    "reason": why,
                    "lastProbeTime": None,
                    "lastTransitionTime": self._start_time,
                }
                for kind, (value, why) in self._conditions.items()
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self._start_time,
            "initContainerStatuses": [c.status() for c in self.init_containers] or None,
            "containerStatuses": [c.status() for c in self.containers],
            "reason": reason,
            "message": message,
        }
        if status == self._last_status:
            return
        meta = self.pod.metadata
        try:
            self.cluster.core.patch_namespaced_pod_status(
                meta.name, meta.namespace, {"status": status}, _content_type=_MERGE_PATCH
            )
            self._last_status = status
        except client.ApiException as error:
            if error.status == 404:
                self._deletion.set()
            else:
                log.warning("status of %s/%s: %s", meta.namespace, meta.name, error.reason)

    # ----- processes ---------------------------------------------------------------------------

    def _spawn(self, container: Container) -> None:
        env = self.files.environments[container.name]
        argv = podfiles.command_line(container.spec, env)
        workdir = self.files.root / (container.spec.working_dir or "").lstrip("/")
        workdir.mkdir(parents=True, exist_ok=True)
        started = now()
        if not argv:
            container.state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": "no command or args (images are not run)",
                    "startedAt": started,
                    "finishedAt": started,
                }
            }
            return
        with container.log_path.open("ab") as output:
            try:
                container.process = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as error:
                container.state = {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": str(error),
                        "startedAt": started,
                        "finishedAt": started,
                    }
                }
                return
        container.pid_path.write_text(f"{container.process.pid}\n")
        container.state = {"running": {"startedAt": started}}

    def _reap(self, container: Container) -> bool:
        """Record the exit of ``container``'s process if it ended; return whether it did."""
        process = container.process
        if process is None or "running" not in container.state:
            return False
        code = process.poll()
        if code is None:
            return False
        exit_code = code if code >= 0 else 128 - code
        container.state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": container.state["running"]["startedAt"],
                "finishedAt": now(),
                "containerID": f"process://{process.pid}",
            }
        }
        with contextlib.suppress(OSError):
            container.pid_path.unlink()
        return True

    def _kill(self, containers: list[Container], grace_seconds: float) -> None:
        running = [c for c in containers if c.process is not None and c.process.poll() is None]
        for container in running:
            assert container.process is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(container.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and any(
            c.process.poll() is None for c in running if c.process is not None
        ):
            time.sleep(0.1)
        for container in running:
            assert container.process is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(container.process.pid, signal.SIGKILL)
            container.process.wait()
            self._reap(container)
        for container in containers:
            container.done = True

    def _deadline_exceeded(self) -> bool:
        limit = self.pod.spec.active_deadline_seconds
        return limit is not None and time.monotonic() - self._started_monotonic > limit

    def _should_restart(self, container: Container) -> bool:
        policy = self.pod.spec.restart_policy or "Always"
        code = container.state["terminated"]["exitCode"]
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    # ----- the life of the pod -----------------------------------------------------------------

    def _prepare(self) -> bool:
        """Set up files, retrying while a volume source is missing; False if interrupted."""
        while not self._interrupted():
            try:
                self.files.prepare()
            except (podfiles.PodSetupError, client.ApiException) as error:
                message = str(error) if isinstance(error, podfiles.PodSetupError) else error.reason
                for container in self.containers:
                    container.state = {
                        "waiting": {"reason": "ContainerCreating", "message": message}
                    }
                self._report(PENDING)
                time.sleep(2)
                continue
            return True
        return False

    def _run_init_containers(self) -> bool:
        """Run the init containers in order; return False if one failed for good."""
        for container in self.init_containers:
            while not container.done:
                self._spawn(container)
                self._report(PENDING)
                while not self._reap(container) and "running" in container.state:
                    if self._interrupted() or self._deadline_exceeded():
                        return False
                    time.sleep(_POLL_SECONDS)
                code = container.state["terminated"]["exitCode"]
                if code == 0:
                    container.done = True
                elif (self.pod.spec.restart_policy or "Always") == "Never":
                    self._report(FAILED)
                    return False
                else:
                    container.restarts += 1
                    container.last_state = container.state
                    self._report(PENDING)
                    time.sleep(min(_MAX_BACKOFF_SECONDS, 2**container.restarts))
        return True

    def _step(self, container: Container) -> None:
        if container.done:
            return
        if container.restart_at is not None:
            if time.monotonic() >= container.restart_at:
                container.restart_at = None
                container.restarts += 1
                self._spawn(container)
            return
        if not self._reap(container):
            return
        if self._should_restart(container):
            container.last_state = container.state
            container.state = {"waiting": {"reason": "CrashLoopBackOff"}}
            container.restart_at = time.monotonic() + min(
                _MAX_BACKOFF_SECONDS, 2.0**container.restarts
            )
        else:
            container.done = True

    def _run_containers(self) -> None:
        for container in self.containers:
            self._spawn(container)
            if "terminated" in container.state and not self._should_restart(container):
                container.done = True
        self._report(RUNNING)
        while not all(c.done for c in self.containers):
            if self._interrupted():
                return
            if self._deadline_exceeded():
                self._kill(self.containers, grace_seconds=self._grace_seconds)
                self._report(
                    FAILED,
                    "DeadlineExceeded",
                    "Pod was active on the node longer than the specified deadline",
                )
                return
            for container in self.containers:
                self._step(container)
            self._report(RUNNING)
            time.sleep(_POLL_SECONDS)
        failed = any(c.state["terminated"]["exitCode"] != 0 for c in self.containers)
        self._report(FAILED if failed else SUCCEEDED)

    def _finish_deletion(self) -> None:
        everything = [*self.init_containers, *self.containers]
        self._kill(everything, grace_seconds=self._grace_seconds)
        failed = any(c.state.get("terminated", {}).get("exitCode", 0) != 0 for c in everything)
        self._report(FAILED if failed else SUCCEEDED)
        self.delete_from_api(self.cluster.core, self.pod)
        self._deleted = True

    @staticmethod
    def delete_from_api(core: client.CoreV1Api, pod: client.V1Pod) -> None:
        """Remove a pod whose processes are gone, as a kubelet does: grace period zero."""
        meta = pod.metadata
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(
                meta.name,
                meta.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta.uid)
                ),
            )

    def run(self) -> None:
        """Thread body: the pod from Pending to a final phase."""
        meta = self.pod.metadata
        try:
            self._report(PENDING)
            if self._prepare():
                self._conditions["PodReadyToStartContainers"] = ("True", None)
                if self._run_init_containers():
                    self._run_containers()
                elif self._deadline_exceeded() and not self._interrupted():
                    self._kill(self.init_containers, grace_seconds=0)
                    self._report(
                        FAILED,
                        "DeadlineExceeded",
                        "Pod was active on the node longer than the specified deadline",
                    )
        except Exception:
            log.exception("pod %s/%s failed in the kubelet", meta.namespace, meta.name)
        finally:
            if self._shutdown.is_set():
                self._kill([*self.init_containers, *self.containers], grace_seconds=3)
            elif self._deletion.is_set():
                self._finish_deletion()
            self._on_finished(self)

    @property
    def deletion_requested(self) -> bool:
        """Whether the pod was seen with a deletionTimestamp."""
        return self._deletion.is_set()

    @property
    def deleted(self) -> bool:
        """Whether the worker removed the pod from the API itself."""
        return self._deleted
