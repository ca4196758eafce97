"""The FlowRun-status checkpoint store: a run's durable state lives in its FlowRun's status.

The runner passes a :class:`StatusStore` to :func:`agentflows.engine.run.run_flow`; the CLI
(``agentflows get``) calls :func:`read_output` to show an offloaded output. The store passes the
engine's contract suite (``tests/cluster/test_status_store.py`` runs it on a real API server).

What is written, and how (see ``kube/NOTES.md`` for who owns which key):

- Only the runner's keys: ``nodes``, ``requests.<id>`` (question fields), ``output``/``outputRef``,
  ``usage``, ``currentNode`` and ``result``. No write carries a resourceVersion, so the operator's
  and the humans' concurrent writes never conflict with ours and are never overwritten.
- Whole values (a node record, the run output, a request's schema or proposal) are replaced with
  a JSON patch ``add`` at their path, not a merge patch: a merge patch would merge a new output
  into the old one key by key, and would turn every ``null`` inside an output into a deletion.
  Typed fields that must merge with another writer's (request questions beside the human's
  decision, ``result``) go as JSON merge patches that never carry a null for a key we don't own.
- The FlowRun stays small whatever the outputs: a node output, node detail (a paused agent's
  conversation), run output, request schema or proposal whose JSON exceeds ``offload_threshold``
  bytes goes to ConfigMaps ``<run>-out-<sha1(key)[:10]>-<part>`` owned by the FlowRun (deleted
  with it by the garbage collector), in parts of at most 512 KiB of UTF-8. An output is then
  referenced as ``outputRef: "configmap:<prefix>:<parts>"`` with a short text preview in
  ``output``; detail, schema and proposal (free-form, with no ref field of their own) become the
  marker ``{"$offloaded": "configmap:<prefix>:<parts>"}``. :meth:`StatusStore.load` fetches them
  back, so the engine always sees full values. Errors and messages are truncated instead: they
  are for people, and the engine never reads them back.
- The run record is the FlowRun itself (``spec.input``, ``spec.trigger``, ``status.startTime``),
  so :meth:`StatusStore.save_run` has nothing of its own to write: it only makes sure
  ``status.nodes`` exists, which tells a later :meth:`StatusStore.load` that the run started,
  and writes nothing when the FlowRun it was given already says so (the operator's startTime).
- Writes are batched so that a quick node costs one status write, not two. A Running record
  and ``currentNode`` wait up to :data:`RUNNING_DELAY` seconds and go with the next write (or
  alone when that time is up); a node that finishes sooner replaces its Running record by its
  final one before anything is sent. Every other record, and the outcome, is written before
  its save returns, together with whatever waits, so a finished node is durable before any
  dependant starts and the engine's contract holds. What a Running record that never went out
  costs: the node's ``attempts`` (and ``limits.maxNodeExecutions``) miss an execution whose
  runner was killed within the delay. :meth:`StatusStore.flush` writes what waits at
  once (the runner calls it when it is stopped). A write that loses a race (409) is retried.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentflows.api import common, errors, retry, times, wellknown
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import store
from agentflows.kube import client as kube_client
from agentflows.kube import mounted, objects

#: Largest part of an offloaded value, in bytes of UTF-8 (a ConfigMap holds at most 1 MiB).
PART_BYTES = 512 * 1024
#: Characters of an offloaded output kept in ``output`` as a preview for people.
PREVIEW_CHARS = 256
#: Characters kept of a node error, a result message or a request's message and summary.
TEXT_LIMIT = 4096
#: Key of the marker that stands in for an offloaded free-form value.
OFFLOADED = "$offloaded"
#: Prefix of every offload reference.
REF_SCHEME = "configmap"
#: Parallel ConfigMap writes and reads of one offloaded value.
_PARALLEL_PARTS = 4
#: Seconds a Running record or ``currentNode`` waits for the next write (see module docstring).
RUNNING_DELAY = 1.0
#: Times a status write that lost a race (409) is tried again.
CONFLICT_RETRIES = 5
#: The waits before those tries: 50 ms doubling (to 0.8 s before the fifth).
CONFLICT_BACKOFF = retry.Backoff(initial=0.05, attempts=CONFLICT_RETRIES + 1)

_TERMINAL_RESULTS = (flowrun_api.RunPhase.SUCCEEDED, flowrun_api.RunPhase.FAILED)
_QUESTION_FIELDS = (
    "node",
    "kind",
    "message",
    "summary",
    "approvers",
    "requested_at",
    "expires_at",
    "on_timeout",
    "error",
)
_FREE_FORM_QUESTION_FIELDS = ("schema_", "proposal")


class OffloadError(errors.PermanentError):
    """An offload reference is malformed or its ConfigMaps are gone: no retry brings it back."""


def _pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) to ``/status/<parts...>``."""
    return common.json_pointer("status", *parts)


def _truncate(text: str | None, limit: int = TEXT_LIMIT) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 16] + " …(truncated)"


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _split_utf8(text: str, limit: int) -> list[str]:
    """Split ``text`` into strings of at most ``limit`` bytes of UTF-8, never inside a character."""
    data = text.encode()
    parts: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:  # a continuation byte
            end -= 1
        parts.append(data[start:end].decode())
        start = end
    return parts or [""]


def _parse_ref(ref: str) -> tuple[str, int]:
    scheme, _, rest = ref.partition(":")
    prefix, _, count = rest.rpartition(":")
    if scheme != REF_SCHEME or not prefix or not count.isdigit():
        raise OffloadError(f'offload reference "{ref}" is not "configmap:<prefix>:<parts>"')
    return prefix, int(count)


def _part_key(index: int) -> str:
    return f"part-{index:04d}"


def offloaded_parts(status: flowrun_api.FlowRunStatus) -> list[tuple[str, str]]:
    """Every ``(configmap, key)`` holding a part of a value ``status`` refers to as offloaded.

    The references are where :class:`StatusStore` writes them: ``outputRef`` of the run and of
    each node record, and the ``$offloaded`` marker of a record's ``detail`` and a request's
    ``schema`` or ``proposal``. A malformed reference names no part (reading it is the error).
    """
    refs: list[Any] = [status.output_ref]
    for record in status.nodes.values():
        refs += [record.output_ref, _marker(record.detail)]
    for request in status.requests.values():
        refs += [_marker(request.schema_), _marker(request.proposal)]
    parts: list[tuple[str, str]] = []
    for ref in refs:
        if not isinstance(ref, str) or not ref:
            continue
        try:
            prefix, count = _parse_ref(ref)
        except OffloadError:
            continue
        parts += [(f"{prefix}-{index}", _part_key(index)) for index in range(count)]
    return parts


def _marker(value: Any) -> Any:
    return (
        value.get(OFFLOADED) if isinstance(value, Mapping) and set(value) == {OFFLOADED} else None
    )


def read_mounted_output(configmaps: mounted.Mounted, namespace: str, ref: str) -> Any:
    """:func:`read_output` from the pod's volume of the run's ConfigMaps (the runner's way)."""
    prefix, count = _parse_ref(ref)
    texts: list[str] = []
    for index in range(count):
        text = configmaps.text(f"{prefix}-{index}", _part_key(index))
        if text is None:
            # the operator mounts every part status refers to: one not there is not stored
            raise OffloadError(f"ConfigMap {namespace}/{prefix}-{index} is gone")
        texts.append(text)
    return json.loads("".join(texts))


async def read_output(client: kube_client.Client, namespace: str, ref: str) -> Any:
    """Read back a value offloaded to ConfigMaps, given its ``configmap:<prefix>:<parts>``."""
    prefix, count = _parse_ref(ref)
    limit = asyncio.Semaphore(_PARALLEL_PARTS)

    async def part(index: int) -> str:
        async with limit:
            try:
                obj = await client.get(
                    kube_client.path_of("configmaps", namespace, f"{prefix}-{index}")
                )
            except kube_client.ApiError as exc:
                if exc.not_found:
                    raise OffloadError(f"ConfigMap {namespace}/{prefix}-{index} is gone") from exc
                raise
        return str((obj.get("data") or {}).get(_part_key(index), ""))

    texts = await asyncio.gather(*(part(i) for i in range(count)))
    return json.loads("".join(texts))


class StatusStore:
    """A :class:`~agentflows.engine.store.CheckpointStore` over one FlowRun's status.

    ``attempt`` is the attempt this store writes ``result`` for (the runner is told it), and
    ``flowrun`` the FlowRun as the caller already read it: the first :meth:`load` uses it
    instead of reading again. Writes are batched (see the module docstring): a Running record
    and ``currentNode`` wait up to ``running_delay`` seconds for the next write; every other
    record, the run's outcome and :meth:`flush` write at once, with everything waiting.
    """

    def __init__(
        self,
        client: kube_client.Client,
        namespace: str,
        name: str,
        *,
        attempt: int,
        flowrun: dict[str, Any] | None = None,
        offload_threshold: int = 8192,
        running_delay: float = RUNNING_DELAY,
        configmaps: mounted.Mounted | None = None,
    ) -> None:
        self.client = client
        #: Where offloaded values are read back from: the pod's volume (the runner, which may
        #: not read ConfigMaps through the API), else the API (a person's tools).
        self.configmaps = configmaps
        self.namespace = namespace
        self.name = name
        self.attempt = attempt
        self.offload_threshold = offload_threshold
        self.running_delay = running_delay
        self._path = kube_client.path_of("flowruns", namespace, name)
        self._status_path = kube_client.path_of("flowruns", namespace, name, sub="status")
        #: The FlowRun as last read (for its uid and labels); None until the first read.
        self._flowrun = flowrun
        #: A read the next load() takes instead of a GET, its status parsed once.
        self._unread = flowrun
        self._unread_status = None if flowrun is None else flowrun_api.status_of(flowrun)
        #: Whether status.nodes exists (None: unknown, a 422 then tells).
        self._has_nodes: bool | None = None
        self._started = False
        if self._unread_status is not None:
            self._has_nodes = "nodes" in self._unread_status.model_fields_set
            self._started = _started(self._unread_status)
        #: Operations waiting for the next write, by path (a later one replaces an earlier one).
        self._waiting: dict[str, dict[str, Any]] = {}
        self._timer: asyncio.Task[None] | None = None
        #: A write of the timer that failed: the next save raises it.
        self._timer_error: kube_client.ApiError | None = None
        self._writing = asyncio.Lock()
        #: True once this store wrote an outcome (and with it the attempt's result).
        self.outcome_saved = False

    # ----- reading ---------------------------------------------------------------------------

    async def flowrun(self) -> dict[str, Any]:
        """The FlowRun, read once and cached (offload writes need its uid and flow)."""
        if self._flowrun is None:
            self._flowrun = await self.client.get(self._path)
        return self._flowrun

    async def load(self) -> store.Checkpoint:
        """Rebuild the checkpoint from the FlowRun, fetching offloaded values back."""
        await self.flush()
        if self._unread is not None and self._unread_status is not None:
            obj, status = self._unread, self._unread_status
        else:
            obj = await self.client.get(self._path)
            status = flowrun_api.status_of(obj)
        self._flowrun, self._unread, self._unread_status = obj, None, None
        spec = obj.get("spec") or {}
        self._has_nodes = "nodes" in status.model_fields_set
        self._started = _started(status)
        checkpoint = store.Checkpoint()
        if self._started:
            checkpoint.run = store.RunRecord(
                name=self.name,
                input=spec.get("input"),
                trigger=spec.get("trigger"),
                started_at=status.start_time
                or obj["metadata"].get("creationTimestamp")
                or times.timestamp(),
            )
        nodes = status.nodes
        records = await asyncio.gather(*(self._node_of(v) for v in nodes.values()))
        checkpoint.nodes = dict(zip(nodes, records, strict=True))
        requests = status.requests
        parsed = await asyncio.gather(*(self._request_of(v) for v in requests.values()))
        checkpoint.requests = dict(zip(requests, parsed, strict=True))
        result = status.result
        if result is not None and result.phase in _TERMINAL_RESULTS:
            output = status.output
            if status.output_ref:
                output = await self._read(status.output_ref)
            checkpoint.outcome = store.Outcome(
                phase=result.phase,
                output=output,
                message=result.message,
                reason=result.reason,
                completed_at=result.finished_at,
                usage=status.usage or common.Usage(),
            )
        return checkpoint

    async def _restore(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {OFFLOADED}:
            return await self._read(str(value[OFFLOADED]))
        return value

    async def _read(self, ref: str) -> Any:
        if self.configmaps is not None:
            return read_mounted_output(self.configmaps, self.namespace, ref)
        return await read_output(self.client, self.namespace, ref)

    async def _node_of(self, record: flowrun_api.NodeStatus) -> flowrun_api.NodeStatus:
        """The record with what it offloaded read back (its output, its detail)."""
        restored: dict[str, Any] = {"detail": await self._restore(record.detail)}
        if record.output_ref:
            restored.update(output=await self._read(record.output_ref), output_ref=None)
        return record.model_copy(update=restored)

    async def _request_of(self, request: flowrun_api.HumanRequest) -> flowrun_api.HumanRequest:
        """The request with its offloaded schema and proposal read back."""
        restored = {
            "schema_": await self._restore(request.schema_),
            "proposal": await self._restore(request.proposal),
        }
        return request.model_copy(update=restored)

    # ----- writing ---------------------------------------------------------------------------

    async def save_run(self, record: store.RunRecord) -> None:
        """Mark the run as started, unless the FlowRun as read shows it has (its startTime)."""
        if self._started:
            return
        await self.client.merge_patch(self._status_path, {"status": {"nodes": {}}})
        self._has_nodes = self._started = True

    async def _node_wire(self, key: str, status: flowrun_api.NodeStatus) -> dict[str, Any]:
        """A node record as the status holds it: large values offloaded, the error cut."""
        wire = status.to_wire()
        wire.pop("outputRef", None)
        if status.output is not None:
            output, ref = await self._bounded_output(key, status.output)
            wire["output"] = output
            if ref is not None:
                wire["outputRef"] = ref
        if status.detail is not None:
            wire["detail"] = await self._bounded_value(f"{key}:detail", status.detail)
        if status.error is not None:
            wire["error"] = _truncate(status.error)
        return wire

    async def save_node(self, key: str, status: flowrun_api.NodeStatus) -> None:
        """Replace the node's record: a Running one with the next write, any other one now."""
        wire = await self._node_wire(key, status)
        op = {"op": "add", "path": _pointer("nodes", key), "value": wire}
        if status.phase == flowrun_api.NodePhase.RUNNING:
            self._wait([op])
            return
        current = self._waiting.get(_pointer("currentNode"))
        if current is not None and current["value"] == key:
            del self._waiting[_pointer("currentNode")]  # it ended before it was named
        await self._commit([op])

    async def fold_nodes(
        self, folded: dict[str, flowrun_api.NodeStatus], removed: Sequence[str]
    ) -> None:
        """Remove ``removed`` and add ``folded`` in one JSON patch, which applies whole or not.

        The ConfigMaps of outputs the removed records had offloaded stay until the FlowRun is
        deleted: a runner may not delete ConfigMaps.
        """
        ops: list[dict[str, Any]] = [
            {"op": "remove", "path": _pointer("nodes", key)} for key in removed
        ]
        for key, status in folded.items():
            wire = await self._node_wire(key, status)
            ops.append({"op": "add", "path": _pointer("nodes", key), "value": wire})
        await self._commit(ops)

    async def save_request(self, request_id: str, request: flowrun_api.HumanRequest) -> None:
        """Write the question fields of a request; a human's decision fields stay untouched."""
        self._raise_timer_error()
        wire = request.to_wire()
        question = {}
        for field in _QUESTION_FIELDS:
            alias = common.wire_name(flowrun_api.HumanRequest, field)
            if alias in wire:
                question[alias] = wire[alias]
        for alias in ("message", "summary", "error"):
            if alias in question:
                question[alias] = _truncate(question[alias])
        await self.client.merge_patch(
            self._status_path, {"status": {"requests": {request_id: question}}}
        )
        ops = []
        for field in _FREE_FORM_QUESTION_FIELDS:
            value = getattr(request, field)
            if value is not None:
                alias = common.wire_name(flowrun_api.HumanRequest, field)
                bounded = await self._bounded_value(f"{request_id}:{alias}", value)
                ops.append(
                    {"op": "add", "path": _pointer("requests", request_id, alias), "value": bounded}
                )
        if ops:
            await self.client.json_patch(self._status_path, ops)

    async def save_outcome(self, outcome: store.Outcome) -> None:
        """Write the run output, usage and ``result`` for this store's attempt, in one patch."""
        output, ref = (None, None)
        if outcome.output is not None:
            output, ref = await self._bounded_output(":output", outcome.output)
        result = flowrun_api.RunnerResult(
            attempt=self.attempt,
            phase=outcome.phase,  # the engine ends in Succeeded, Failed or Waiting
            reason=_truncate(outcome.reason, 256),
            message=_truncate(outcome.message),
            finished_at=outcome.completed_at or times.timestamp(),
        )
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": _pointer("output"), "value": output},
            # a null "add" on a typed field removes it (the API server prunes nulls)
            {"op": "add", "path": _pointer("outputRef"), "value": ref},
            {"op": "add", "path": _pointer("usage"), "value": outcome.usage.to_wire()},
            {"op": "add", "path": _pointer("currentNode"), "value": None},
            {"op": "add", "path": _pointer("result"), "value": result.to_wire()},
        ]
        await self._commit(ops)
        self.outcome_saved = True

    def save_current_node(self, key: str) -> None:
        """Name a node running now in ``status.currentNode``, with the next write."""
        if not self.outcome_saved:
            self._wait([{"op": "add", "path": _pointer("currentNode"), "value": key}])

    async def flush(self) -> None:
        """Write what waits (Running records, ``currentNode``) now; nothing waiting, no request."""
        await self._commit([])

    def _wait(self, ops: list[dict[str, Any]]) -> None:
        """Keep ``ops`` for the next write, which happens within ``running_delay`` seconds."""
        self._raise_timer_error()
        for op in ops:
            self._waiting[op["path"]] = op
        if self._timer is None:
            self._timer = asyncio.create_task(self._write_later())

    async def _write_later(self) -> None:
        await asyncio.sleep(self.running_delay)
        self._timer = None
        try:
            await self._commit([])
        except kube_client.ApiError as exc:
            self._timer_error = exc

    def _raise_timer_error(self) -> None:
        if self._timer_error is not None:
            raise self._timer_error

    async def _commit(self, ops: list[dict[str, Any]]) -> None:
        """Write ``ops`` and everything waiting in one JSON patch (none at all: no request)."""
        self._raise_timer_error()
        async with self._writing:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch = dict(self._waiting)
            self._waiting.clear()
            for op in ops:
                batch[op["path"]] = op
            if not batch:
                return
            writes_nodes = any(path.startswith(_pointer("nodes", "")) for path in batch)
            operations = list(batch.values())
            if writes_nodes and self._has_nodes is False:
                operations.insert(0, {"op": "add", "path": _pointer("nodes"), "value": {}})
            await self._patch(operations, parents={"nodes": {}} if writes_nodes else {})
            if writes_nodes:
                self._has_nodes = True

    async def _patch(self, ops: list[dict[str, Any]], *, parents: dict[str, Any]) -> None:
        """Apply JSON patch ``add`` operations, retrying conflicts and creating missing parents.

        ``add`` fails (422) when its parent object does not exist yet; a merge patch of empty
        objects creates the parents without changing any that exist, and the add is retried.
        No write carries a resourceVersion, so a 409 is the API server's own optimistic
        concurrency losing a race with another writer's patch: trying again is safe.
        """
        missing: dict[str, Any] | None = parents
        tries = CONFLICT_BACKOFF.tries()
        while True:
            try:
                await self.client.json_patch(self._status_path, ops)
                return
            except kube_client.ApiError as exc:
                if exc.status == 422 and missing is not None:
                    await self.client.merge_patch(self._status_path, {"status": missing})
                    missing = None
                    continue
                delay = tries.failed() if exc.conflict else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    # ----- offload ---------------------------------------------------------------------------

    async def _bounded_output(self, key: str, value: Any) -> tuple[Any, str | None]:
        """``(output, outputRef)`` for the status: the value itself, or a preview and a ref."""
        text = _json_text(value)
        if len(text.encode()) <= self.offload_threshold:
            return value, None
        ref = await self._offload(key, text)
        preview = text[:PREVIEW_CHARS] + "…"
        return preview, ref

    async def _bounded_value(self, key: str, value: Any) -> Any:
        """A free-form value for the status: itself, or the offload marker."""
        text = _json_text(value)
        if len(text.encode()) <= self.offload_threshold:
            return value
        return {OFFLOADED: await self._offload(key, text)}

    async def _offload(self, key: str, text: str) -> str:
        """Write ``text`` to ConfigMaps owned by the FlowRun and return its reference."""
        obj = await self.flowrun()
        prefix = objects.offload_prefix(self.name, key)
        parts = _split_utf8(text, PART_BYTES)
        owner = objects.owner_reference(obj, controller=False, block=False)
        flow = str((obj.get("spec") or {}).get("flow") or "")
        labels = {
            **objects.run_labels(self.name, flow),
            wellknown.OUTPUT: prefix.rsplit("-", 1)[-1],
        }
        if not flow:
            del labels[wellknown.FLOW]
        limit = asyncio.Semaphore(_PARALLEL_PARTS)

        async def write(index: int, part: str) -> None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"{prefix}-{index}",
                    "namespace": self.namespace,
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "data": {_part_key(index): part},
            }
            async with limit:
                collection = kube_client.path_of("configmaps", self.namespace)
                await objects.create_or_replace(self.client, collection, body)

        await asyncio.gather(*(write(i, p) for i, p in enumerate(parts)))
        return f"{REF_SCHEME}:{prefix}:{len(parts)}"


def _started(status: flowrun_api.FlowRunStatus) -> bool:
    """True once the operator or a runner has started the run."""
    fields = ("start_time", "nodes", "requests", "result", "output", "output_ref")
    return not status.model_fields_set.isdisjoint(fields)
