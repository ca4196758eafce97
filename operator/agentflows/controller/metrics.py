"""Prometheus metrics of the operator (prefix ``agentflows_``), served on ``--metrics-port``.

Labels are bounded: namespace, flow, phase, node type, model, resource kind — never a run name.
What runner pods do reaches the operator through FlowRun status; :meth:`Metrics.run_finished`
turns a finished run's status into node durations, tokens and cost exactly once, at the run's
terminal transition. The alerts and the dashboard built on these are in ``config/prometheus``
and ``docs/runbook.md``.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client import metrics_core

from agentflows.api import budget as budget_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import times
from agentflows.controller.runtime import unmet, workqueue

_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)
_QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_NODE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800)


def _drop(gauge: prometheus_client.Gauge, labels: tuple[str, ...]) -> None:
    """Remove one series of a gauge, if it is there."""
    try:
        gauge.remove(*labels)
    except KeyError:
        return


class Metrics:
    """The operator's metrics in their own registry."""

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry or prometheus_client.CollectorRegistry()
        #: Wall-clock seconds of the oldest-pending timestamps (tests pass their own).
        self._clock = clock
        #: What the operator needs and cannot get (``/readyz`` answers 503 with it).
        self.unmet = unmet.Unmet()
        r = self.registry
        self.runs = prometheus_client.Gauge(
            "agentflows_runs", "FlowRuns by phase.", ["namespace", "flow", "phase"], registry=r
        )
        self.run_duration = prometheus_client.Histogram(
            "agentflows_run_duration_seconds",
            "Time from a run's start to its end.",
            ["namespace", "flow", "phase"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.node_duration = prometheus_client.Histogram(
            "agentflows_node_duration_seconds",
            "Time a node took, by node type.",
            ["namespace", "flow", "node_type", "phase"],
            buckets=_NODE_BUCKETS,
            registry=r,
        )
        self.tokens = prometheus_client.Counter(
            "agentflows_tokens_total",
            "Model tokens used by finished runs.",
            ["namespace", "flow", "model", "kind"],
            registry=r,
        )
        self.cost = prometheus_client.Counter(
            "agentflows_cost_usd_total",
            "Model cost in US dollars of finished runs.",
            ["namespace", "flow", "model"],
            registry=r,
        )
        self.pod_create_failures = prometheus_client.Counter(
            "agentflows_pod_create_failures_total",
            "Runner pods the API server refused to create, by its reason (e.g. Forbidden).",
            ["namespace", "reason"],
            registry=r,
        )
        self.pod_attempts = prometheus_client.Counter(
            "agentflows_pod_attempts_total",
            "Runner pods created.",
            ["namespace", "flow"],
            registry=r,
        )
        self.reconciles = prometheus_client.Counter(
            "agentflows_reconciles_total",
            "Reconciles run (successful or not), by resource kind.",
            ["kind"],
            registry=r,
        )
        self.sessions_retired = prometheus_client.Counter(
            "agentflows_sessions_retired_total",
            "AgentSessions deleted by retention (maxSessions, maxAgeSeconds), by namespace.",
            ["namespace"],
            registry=r,
        )
        self.validations = prometheus_client.Counter(
            "agentflows_validations_total",
            "Flows and Agents validated (only when they or what they reach changed).",
            ["kind"],
            registry=self.registry,
        )
        self.reconcile_errors = prometheus_client.Counter(
            "agentflows_reconcile_errors_total",
            "Reconciles that raised (and were retried), by resource kind.",
            ["kind"],
            registry=r,
        )
        self.requests_pending = prometheus_client.Gauge(
            "agentflows_requests_pending",
            "Human requests waiting for a decision, by request kind.",
            ["namespace", "flow", "kind"],
            registry=r,
        )
        self.request_wait = prometheus_client.Histogram(
            "agentflows_request_wait_seconds",
            "Time from a human request to its decision (decision: approve, reject, edit, respond,"
            " or expired).",
            ["namespace", "flow", "kind", "decision"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = prometheus_client.Histogram(
            "agentflows_workqueue_wait_seconds",
            "Time a key waited in the work queue before its reconcile started, by resource kind.",
            ["kind"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.reconcile_time = prometheus_client.Histogram(
            "agentflows_reconcile_seconds",
            "Time a reconcile took (its API writes included), by resource kind.",
            ["kind"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.api_request = prometheus_client.Histogram(
            "agentflows_api_request_seconds",
            "Time the API server took to answer the operator's requests (watches not counted),"
            " by HTTP method.",
            ["method"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.leader = prometheus_client.Gauge(
            "agentflows_leader",
            "1 while this replica holds the operator's Lease and works, 0 while it stands by.",
            registry=r,
        )
        budget_labels = ["namespace", "budget", "window"]
        self.budget_used_usd = prometheus_client.Gauge(
            "agentflows_budget_used_usd",
            "Model cost charged to a Budget in its current window (day, month), USD.",
            budget_labels,
            registry=r,
        )
        self.budget_limit_usd = prometheus_client.Gauge(
            "agentflows_budget_limit_usd",
            "A Budget window's cost limit, USD (absent: no cost limit).",
            budget_labels,
            registry=r,
        )
        self.budget_used_tokens = prometheus_client.Gauge(
            "agentflows_budget_used_tokens",
            "Tokens charged to a Budget in its current window (day, month).",
            budget_labels,
            registry=r,
        )
        self.budget_limit_tokens = prometheus_client.Gauge(
            "agentflows_budget_limit_tokens",
            "A Budget window's token limit (absent: no token limit).",
            budget_labels,
            registry=r,
        )
        for kind in (workqueue.AGENT, workqueue.FLOW, workqueue.FLOWRUN, workqueue.HISTORY):
            # Present at 0 from the start, so rates and alerts on them have a series to read.
            self.reconciles.labels(kind)
            self.reconcile_errors.labels(kind)
        self._phase_of: dict[tuple[str, str], tuple[str, str, str]] = {}
        #: run -> its (namespace, flow) and when it was first seen Pending (while it is)
        self._pending_since: dict[tuple[str, str], tuple[tuple[str, str], float]] = {}
        #: run -> (namespace, flow, kind) -> since when it has had requests of that kind
        self._waiting_since: dict[tuple[str, str], dict[tuple[str, str, str], float]] = {}
        self.registry.register(_OldestPending(self._pending_since, self._waiting_since))
        #: run -> the (namespace, flow, kind) gauge children it counts in, and how many
        self._pending_of: dict[tuple[str, str], dict[tuple[str, str, str], int]] = {}

    def watch_triggers(self, watches: Callable[[], Mapping[tuple[str, str], bool]]) -> None:
        """Export ``agentflows_trigger_watches{api_version,kind}`` (1: established) per scrape."""
        self.registry.register(_TriggerWatches(watches))

    def queue_timing(self, key: workqueue.Key, waited: float, took: float) -> None:
        """Observe one reconcile's wait in the queue and its own time."""
        self.queue_wait.labels(key.kind).observe(waited)
        self.reconcile_time.labels(key.kind).observe(took)

    def api_answered(self, method: str, seconds: float) -> None:
        """Observe one answered API request."""
        self.api_request.labels(method).observe(seconds)

    def watch_queue(self, depth: Callable[[], int]) -> None:
        """Export ``agentflows_reconcile_queue_depth`` (keys waiting or in work) per scrape."""
        self.registry.register(_QueueDepth(depth))

    def serve(self, port: int, ready: Callable[[], bool] = lambda: True) -> None:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` in a background thread.

        ``/healthz`` answers while the process runs; ``/readyz`` answers 200 once ``ready()``
        (the operator's cache has its first lists) and nothing is :attr:`unmet`, else 503 with
        what is missing, one line each. A thread, so a busy event loop never fails a probe.
        """
        registry = self.registry
        needs = self.unmet

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(
                        200,
                        prometheus_client.generate_latest(registry),
                        prometheus_client.CONTENT_TYPE_LATEST,
                    )
                elif path == "/healthz":
                    self._answer(200, b"ok\n")
                elif path == "/readyz":
                    missing = needs.messages()
                    if missing:
                        self._answer(503, "".join(f"not ready: {m}\n" for m in missing).encode())
                    elif ready():
                        self._answer(200, b"ok\n")
                    else:
                        self._answer(503, b"syncing\n")
                else:
                    self._answer(404, b"not found: /metrics, /healthz, /readyz\n")

            def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes and scrapes are not logged."""

        server = http.server.ThreadingHTTPServer(("", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()

    def observe_run(
        self, namespace: str, name: str, flow: str, phase: str, pending: dict[str, int]
    ) -> None:
        """Record a run's current phase and its pending requests by kind (gauges)."""
        key = (namespace, name)
        old = self._phase_of.get(key)
        if old != (namespace, flow, phase):
            if old is not None:
                self.runs.labels(*old).dec()
            self.runs.labels(namespace, flow, phase).inc()
            self._phase_of[key] = (namespace, flow, phase)
        counts = {(namespace, flow, kind): n for kind, n in pending.items() if n}
        old_counts = self._pending_of.pop(key, {})
        for labels in old_counts.keys() | counts.keys():
            delta = counts.get(labels, 0) - old_counts.get(labels, 0)
            if delta:
                self.requests_pending.labels(*labels).inc(delta)
        if counts:
            self._pending_of[key] = counts
        self._track_since(key, namespace, flow, phase, counts.keys())

    def _track_since(
        self,
        key: tuple[str, str],
        namespace: str,
        flow: str,
        phase: str,
        kinds: Iterable[tuple[str, str, str]],
    ) -> None:
        now = self._clock()
        if phase == flowrun_api.RunPhase.PENDING.value:
            self._pending_since.setdefault(key, ((namespace, flow), now))
        else:
            self._pending_since.pop(key, None)
        waiting = self._waiting_since.pop(key, {})
        since = {labels: waiting.get(labels, now) for labels in kinds}
        if since:
            self._waiting_since[key] = since

    def held_on_purpose(self, namespace: str, name: str) -> None:
        """Take a Pending run that a Budget holds out of the oldest-Pending gauge.

        That gauge (and the alert AgentflowsRunsStuckPending) speaks of runs whose pod cannot be
        created; a held run waits on purpose and says why in its condition.
        """
        self._pending_since.pop((namespace, name), None)

    def forget_run(self, namespace: str, name: str) -> None:
        """A run was deleted: take it out of the gauges."""
        old = self._phase_of.pop((namespace, name), None)
        if old is not None:
            self.runs.labels(*old).dec()
        for labels, count in self._pending_of.pop((namespace, name), {}).items():
            self.requests_pending.labels(*labels).dec(count)
        self._pending_since.pop((namespace, name), None)
        self._waiting_since.pop((namespace, name), None)

    def observe_budget(
        self,
        namespace: str,
        name: str,
        spec: budget_api.BudgetSpec,
        status: budget_api.BudgetStatus,
    ) -> None:
        """Set a Budget's gauges from its status (windows rolled over) and limits."""
        for window in budget_api.Window:
            labels = (namespace, name, window.value)
            usage = status.usage(window)
            self.budget_used_usd.labels(*labels).set(usage.cost_usd if usage else 0.0)
            self.budget_used_tokens.labels(*labels).set(usage.tokens if usage else 0)
            limit = spec.limit(window) or budget_api.Limit()
            for gauge, value in (
                (self.budget_limit_usd, limit.cost_usd),
                (self.budget_limit_tokens, limit.tokens),
            ):
                if value is not None:
                    gauge.labels(*labels).set(value)
                else:
                    _drop(gauge, labels)

    def forget_budget(self, namespace: str, name: str) -> None:
        """A Budget was deleted (or is set again): take its series out."""
        gauges = (
            self.budget_used_usd,
            self.budget_limit_usd,
            self.budget_used_tokens,
            self.budget_limit_tokens,
        )
        for window in budget_api.Window:
            for gauge in gauges:
                _drop(gauge, (namespace, name, window.value))

    def run_finished(
        self,
        namespace: str,
        flow: str,
        phase: str,
        status: flowrun_api.FlowRunStatus,
        flow_spec: flow_api.FlowSpec | None,
        agent_models: dict[str, str],
    ) -> None:
        """Observe a run's duration, node durations and usage once, when it finishes."""
        started = times.parse_time(status.start_time)
        ended = times.parse_time(status.completion_time) or times.now()
        if started is not None:
            self.run_duration.labels(namespace, flow, phase).observe(
                (ended - started).total_seconds()
            )
        kinds = {n.id: n.kind for n in flow_spec.nodes} if flow_spec else {}
        models = _node_models(flow_spec, agent_models) if flow_spec else {}
        for node_id, node in status.nodes.items():
            base = flowrun_api.node_of_key(node_id)[0]
            node_type = kinds.get(base, "unknown")
            begin = times.parse_time(node.started_at)
            end = times.parse_time(node.finished_at)
            # a folded record spans many iterations: not one execution's duration
            folded = flowrun_api.folded_range(node_id) is not None
            if begin is not None and end is not None and not folded:
                self.node_duration.labels(namespace, flow, node_type, node.phase.value).observe(
                    max(0.0, (end - begin).total_seconds())
                )
            usage = node.usage
            if usage is None:
                continue
            model = models.get(base, "unknown")
            for kind, tokens in (
                ("prompt", usage.prompt_tokens),
                ("completion", usage.completion_tokens),
            ):
                if tokens:
                    self.tokens.labels(namespace, flow, model, kind).inc(tokens)
            if usage.cost_usd:
                self.cost.labels(namespace, flow, model).inc(usage.cost_usd)

    def request_waited(
        self, namespace: str, flow: str, request: flowrun_api.HumanRequest, decision: str
    ) -> None:
        """Observe how long a request waited for its decision (or its expiry), once."""
        asked = times.parse_time(request.requested_at)
        until = request.expires_at if decision == "expired" else request.decided_at
        answered = times.parse_time(until) or times.now()
        if asked is not None:
            self.request_wait.labels(namespace, flow, request.kind.value, decision).observe(
                max(0.0, (answered - asked).total_seconds())
            )


class _TriggerWatches:
    """The kubernetes-trigger watches the operator runs, read when /metrics is scraped."""

    def __init__(self, watches: Callable[[], Mapping[tuple[str, str], bool]]) -> None:
        self._watches = watches

    def collect(self) -> Iterator[metrics_core.Metric]:
        family = metrics_core.GaugeMetricFamily(
            "agentflows_trigger_watches",
            "Watches of kubernetes triggers (1: established, 0: starting or retrying).",
            labels=["api_version", "kind"],
        )
        try:
            # Scrapes run in the metrics thread while the event loop may change the watches.
            watches = dict(self._watches())
        except RuntimeError:
            watches = {}
        for (api_version, kind), established in sorted(watches.items()):
            family.add_metric([api_version, kind], 1.0 if established else 0.0)
        yield family


class _OldestPending:
    """When the oldest Pending run and the oldest undecided request of each flow began.

    Unix timestamps of when the operator first saw them (``time() - x`` is the age; after an
    operator restart the clock starts again), read when /metrics is scraped; a flow with
    nothing pending has no series.
    """

    def __init__(
        self,
        runs: dict[tuple[str, str], tuple[tuple[str, str], float]],
        requests: dict[tuple[str, str], dict[tuple[str, str, str], float]],
    ) -> None:
        self._runs = runs
        self._requests = requests

    def collect(self) -> Iterator[metrics_core.Metric]:
        runs = metrics_core.GaugeMetricFamily(
            "agentflows_oldest_pending_run_timestamp_seconds",
            "When the oldest run of the flow in phase Pending (no runner pod) was first seen.",
            labels=["namespace", "flow"],
        )
        requests = metrics_core.GaugeMetricFamily(
            "agentflows_oldest_pending_request_timestamp_seconds",
            "When the oldest undecided human request of the flow, by kind, was first seen.",
            labels=["namespace", "flow", "kind"],
        )
        run_since: list[tuple[tuple[str, ...], float]] = []
        request_since: list[tuple[tuple[str, ...], float]] = []
        try:
            # Scrapes run in the metrics thread while the event loop may change the dicts.
            run_since += self._runs.values()
            request_since += [item for d in list(self._requests.values()) for item in d.items()]
        except RuntimeError:
            run_since, request_since = [], []
        for family, items in ((runs, run_since), (requests, request_since)):
            oldest: dict[tuple[str, ...], float] = {}
            for labels, since in items:
                oldest[labels] = min(since, oldest.get(labels, since))
            for labels, since in sorted(oldest.items()):
                family.add_metric(list(labels), since)
            yield family


class _QueueDepth:
    """The work queue's depth, read when /metrics is scraped."""

    def __init__(self, depth: Callable[[], int]) -> None:
        self._depth = depth

    def collect(self) -> Iterator[metrics_core.Metric]:
        yield metrics_core.GaugeMetricFamily(
            "agentflows_reconcile_queue_depth",
            "Keys waiting for a reconcile or being reconciled.",
            value=float(self._depth()),
        )


def _node_models(spec: flow_api.FlowSpec, agent_models: dict[str, str]) -> dict[str, str]:
    models: dict[str, str] = {}
    for node in spec.nodes:
        if node.llm is not None:
            models[node.id] = node.llm.model.name
        agent_call = node.agent or (node.map.agent if node.map else None)
        if agent_call is not None:
            models[node.id] = agent_models.get(agent_call.name, "unknown")
    return models
