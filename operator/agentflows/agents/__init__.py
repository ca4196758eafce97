"""The agents layer: model calls, agent turns and tools, behind the engine's capabilities.

Modules, by who calls them:

- :mod:`~agentflows.agents.host` — :class:`~agentflows.agents.host.LiveCapabilities`, what the
  runner and ``agentflows run`` give the engine;
- :mod:`~agentflows.agents.mock` — :class:`~agentflows.agents.mock.MockCapabilities` for
  ``--dry-run``, and :func:`~agentflows.agents.mock.needs_mock`;
- :mod:`~agentflows.agents.secrets` — :func:`~agentflows.agents.secrets.secret_env_name`, shared
  with the pod builder;
- beneath them: :mod:`~agentflows.agents.turn` (the tool-calling loop),
  :mod:`~agentflows.agents.model` (litellm, imported lazily), :mod:`~agentflows.agents.tools`
  (the registry and its provider protocol), :mod:`~agentflows.agents.spec_tools`,
  :mod:`~agentflows.agents.http_tool` and :mod:`~agentflows.agents.python_tool`.

Invariants:
- importing any module here does not import litellm (it takes seconds);
- no secret value appears in a result, a detail, an error or a message sent to a model;
- a failing tool is an error result for the model, never a failed turn.
"""
