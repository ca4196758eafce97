"""The generic controller runtime: what any controller needs, whatever it reconciles.

- :mod:`~agentflows.controller.runtime.workqueue`: a keyed, de-duplicated work queue, fair
  between namespaces, with per-key backoff, requeue-after and terminal errors (controller-runtime's
  ``TerminalError``);
- :mod:`~agentflows.controller.runtime.leader`: leader election on a ``coordination.k8s.io``
  Lease, so only one replica works;
- :mod:`~agentflows.controller.runtime.unmet`: the needs no retry can meet, each logged once as
  an error and shown on ``/readyz`` until a person meets it.

Called by the operator (:mod:`agentflows.controller.main` runs the queue under the Lease, the
cache and the reconcilers add keys). The informer that feeds the queue is not here but in
:mod:`agentflows.kube.informer`: the triggers watch with it too, and ``kube`` is a lower layer
already.

This package imports only :mod:`agentflows.api`, :mod:`agentflows.kube` and libraries, never the
reconcilers nor anything else of :mod:`agentflows.controller` (an import-linter contract in
``pyproject.toml``): what it needs from the operator (a metric to set, the operator's flags) is
handed to it.
"""
