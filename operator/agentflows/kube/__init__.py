"""Kubernetes adapters: API client, FlowRun-status store, output offload, runner pod spec.

Invariants:
- writes to a FlowRun's status are JSON merge patches of the writer's own keys, never a full
  replace, so the operator, the runner and humans never overwrite each other;
- secret values are never read or written here: Secrets reach pods only as the files of a
  secrets volume (``controller/pods.secrets_volume``), never as env;
- every create is idempotent: deterministic names, and AlreadyExists means done.
"""
