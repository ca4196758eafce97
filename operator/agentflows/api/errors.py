"""The project's one error tree: every error that leaves its module says whether a retry helps.

::

    Exception
     └── AgentflowsError          .retryable: may the same work succeed if it is tried again?
          │                        False unless the class or the instance says otherwise
          ├── PermanentError       no, and the run cannot go on from what is stored: the runner
          │    │                   ends it Failed (StateLost) instead of leaving it to a new pod
          │    ├── engine.state.RunStopped, engine.state.NodeFailed
          │    └── kube.status_store.OffloadError
          ├── per instance, from what happened (an HTTP status: api.retry.status_may_help, 408,
          │   425, 429, 5xx or no answer; a model provider's 409 too):
          │    kube.client.ApiError, agents.openai_compat.ModelHttpError,
          │    agents.http_tool.FetchError (and its private _ResponseError),
          │    agents.sessions.StoreError, kube.kubeconfig.ConfigError (yes only for an exec
          │    plugin that failed), engine.capabilities.CapabilityError (+ agents.files.FileError;
          │    .source says which service failed)
          ├── yes: agents.mcp.McpUnavailable (its McpRefused: no), engine.expressions.
          │   ExpressionBusy and engine.jqsandbox.Busy (every evaluator was busy),
          │   cli.run_lock.RunBusy (another process holds the run)
          └── no: what is wrong stays wrong until someone changes it
               api.kubeyaml.YamlError, engine.graph.FlowInvalid, engine.expressions.
               ExpressionError, engine.jqsandbox.Exceeded, engine.jqsandbox.EvaluationError,
               agents.egress.HostNotAllowed, agents.egress.InvalidUrl, agentspec.errors.
               SpecInvalid, agentspec.conversation.ConversationError, diagram.svg_render.
               GraphvizMissing, diagram.svg_render.LayoutFailed, kube.snapshot.SnapshotError,
               controller.settings.SettingsError (the operator's flags), controller.runtime.
               leader.LeadershipLost, triggers.common.TriggerError, triggers.signing.
               StaleTimestamp, cli.group.UsageError, cli.local_runs.StateError, console.forms.
               FormError;
               and ValueErrors too, for the pydantic validators and ``except ValueError``
               callers that catch them: api.patterns.PatternError, api.crd.UnsupportedSchema,
               engine.store.StateFileError, agentspec.implementations.ModuleError

Not in the tree, on purpose: control-flow signals that unwind a loop or a task and are caught
before anyone could retry them, so ``retryable`` would mean nothing: ``engine.state.Paused`` (a
sub-flow ended waiting for a human; caught by the engine's run loop, never outside the engine),
``engine.jqsandbox._Gone`` (a worker died before reading its request; another is tried),
``triggers.webhook._Reject`` (answer this HTTP status) and ``agents.python_tool._OutputTooLarge``
(turned into the tool's failure), each private to its module.

Who acts on ``retryable``: the engine retries a node on a retryable CapabilityError when the
node's retry policy covers its source; the API and model clients retry a retryable answer
within their deadlines; the runner ends a run Failed on a PermanentError and exits 2 on any
other error, a lost attempt the operator retries with backoff; the operator's work queue
(:mod:`agentflows.controller.runtime.workqueue`) stops retrying a reconcile whose error is not
retryable (controller-runtime's terminal error) and records it on the object, except an
``ApiError``, whose ``retryable`` speaks of the one request: the next reconcile reads again
(a conflict, an object gone or not there yet).
"""

from __future__ import annotations


class AgentflowsError(Exception):
    """Base of the project's errors; ``retryable`` says whether trying again may help."""

    retryable: bool = False


class PermanentError(AgentflowsError):
    """Trying again cannot help, and the run cannot go on: something must change first."""

    retryable = False
