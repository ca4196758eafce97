"""Open Agent Specification (Agent Spec): parse, validate, translate to Agent/Flow and back.

Layer: above ``api``, ``engine`` and ``agents``, below ``cli`` (import-linter contract).

- :mod:`.document` reads a JSON or YAML document (bounded, through the kubectl-compatible YAML
  reader), checks ``agentspec_version`` and resolves ``$referenced_components`` /
  ``$component_ref`` into one tree.
- :mod:`.model` types the supported components (pydantic, unknown fields refused).
- :mod:`.checks` applies the graph rules of the reference runtime, every problem with its path.
- :mod:`.importer` turns a document into Agent and Flow resources (tools and agents through
  :mod:`.components`, names and models through :mod:`.mapping`); :mod:`.exporter` goes back,
  reading the importer's jq shapes with :mod:`.jqshapes`.
- :mod:`.conversation` is the Python API for hosts that drive a document as a conversation
  (user messages, client tool results and confirmations between steps).
- :mod:`.errors` holds the one error, :class:`~.errors.SpecInvalid`, with every problem.

Why our own models and not the official ``pyagentspec`` deserializer: its releases pin
``pydantic<2.14`` while agentflows pins pydantic 2.14.3 (one environment cannot hold both, and
an extra would not change that), its 26.3.1 version list skips 26.2.0 (so 26.2.0 documents are
refused), and its deserializer raised an internal TypeError on a small valid flow with an
AgentNode. Field names here follow the Agent Spec specification and ``pyagentspec``'s models.
"""
