"""The in-pod entry point: run one attempt of a FlowRun with the status-backed store, exit.

``agentflows runner --namespace NS --flowrun NAME`` (the runner pod's command, see
:mod:`agentflows.runner.main`) reads the FlowRun and its snapshot ConfigMap, runs the engine
with :class:`agentflows.kube.status_store.StatusStore`, writes ``status.result`` for its
attempt and exits 0 (Succeeded), 1 (Failed, permanently) or 3 (Waiting for a human). The
contracts with the operator and with humans are in ``agentflows/kube/NOTES.md``.

Imports stay light (no ``kubernetes`` package): a pod's cold start counts.
"""
