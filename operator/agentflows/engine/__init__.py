"""The host-agnostic flow engine: validate -> compile -> run -> outcome.

It knows nothing of Kubernetes or of model providers. Everything outside — model calls, agent
turns, tools, sub-flow definitions, the checkpoint store, human requests — comes in through the
small protocols in :mod:`agentflows.engine.capabilities` and :mod:`agentflows.engine.store`,
and time through the host's clock (:data:`agentflows.api.times.Clock`).

Modules, each importing only those below it (an import-linter contract): ``run`` (the loop
that schedules a flow's nodes) -> ``nodes`` (what each kind computes) -> ``lifecycle`` (the one
writer of node records: usage, limits, events, retries) -> ``state`` (the run's shared state)
-> ``store``, ``scope``, ``graph`` -> ``nodetools`` (nodes offered to agents as tools) ->
``capabilities``, ``expressions``, ``envelope`` ->
``errors``, ``spans``.

Invariants:
- a node whose record in the store is Succeeded/Failed/Skipped is never executed again;
- a node's result reaches the store before any of its dependants starts;
- a paused node (Waiting) resumes only when its request carries a decision;
- a node's record is written only by :mod:`agentflows.engine.lifecycle`, so plain nodes, map
  items and sub-flow nodes count usage, limits and attempts the same way; the one exception is
  a fold of a loop's older iterations (:func:`agentflows.engine.loops.fold`), which replaces
  finished records by one that keeps their usage and attempts.
"""
