"""The agentflows operator: watches Agents, Flows, FlowRuns and runner pods into a cache.

One list and one watch per kind keep :mod:`~agentflows.controller.cache` current; every change
enqueues the keys it affects on a :class:`~agentflows.controller.runtime.workqueue.WorkQueue`
(:mod:`~agentflows.controller.runtime`: the parts any controller needs), and the reconcilers
(``agents``, ``flows``, ``flowruns``) read from the cache, decide, and write merge patches of
the keys the operator owns (``kube/NOTES.md``), once per reconcile. Nothing the
operator decides lives only in memory: a restarted operator lists every object again and
continues. See ``NOTES.md`` for the invariants and ``docs/operator.md`` for the read and write
paths.
"""
