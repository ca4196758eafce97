"""The host-agnostic flow engine: validate -> compile -> run -> outcome.

It knows nothing of Kubernetes or of model providers. Everything outside — model calls, agent
turns, tools, sub-flow definitions, the checkpoint store, human requests — comes in through the
small protocols in :mod:`agentflows.engine.capabilities` and :mod:`agentflows.engine.store`.

Invariants:
- a node whose record in the store is Succeeded/Failed/Skipped is never executed again;
- a node's result reaches the store before any of its dependants starts;
- a paused node (Waiting) resumes only when its request carries a decision.
"""
