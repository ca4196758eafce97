"""The agentflows operator: kopf watches Agents, Flows, FlowRuns and runner pods.

kopf is used only to watch and to deliver events; every event just enqueues a key on a
:class:`~agentflows.controller.workqueue.WorkQueue`, and the reconcilers (``agents``, ``flows``,
``flowruns``) read the current objects from the API, decide, and write merge patches of the keys
the operator owns (``kube/NOTES.md``). Nothing the operator decides lives only in memory: a
restarted operator lists every object again and continues. See ``NOTES.md`` for the invariants.
"""
