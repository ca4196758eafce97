"""The agents layer: model calls, agent turns and tools, behind the engine's capabilities.

Modules, by who calls them:

- :mod:`~agentflows.agents.host` — :class:`~agentflows.agents.host.LiveCapabilities`, what the
  runner and ``agentflows run`` give the engine;
- :mod:`~agentflows.agents.mock` — :class:`~agentflows.agents.mock.MockCapabilities` for
  ``--dry-run``, and :func:`~agentflows.agents.mock.needs_mock`;
- :mod:`~agentflows.agents.secrets` — :func:`~agentflows.agents.secrets.secret_env_name`, shared
  with the pod builder;
- for the operator's Agent status: :func:`agentflows.agents.mcp.discover_tools` (an MCP server's
  tools, with a timeout; :class:`~agentflows.agents.mcp.McpUnavailable` when unreachable) and
  :func:`agentflows.agents.spec_tools.declared_tool_names` (every other tool);
- beneath them: :mod:`~agentflows.agents.turn` (the tool-calling loop),
  :mod:`~agentflows.agents.compression` (context compression), :mod:`~agentflows.agents.model`
  (one completion: :mod:`~agentflows.agents.openai_compat` over httpx for OpenAI-compatible
  endpoints, litellm — imported lazily — for the rest), :mod:`~agentflows.agents.costs`
  (prices and context windows from litellm's table, without importing litellm),
  :mod:`~agentflows.agents.tools` (the registry and its provider protocol) and the providers:
  :mod:`~agentflows.agents.spec_tools` (``http``, ``python``, skill scripts),
  :mod:`~agentflows.agents.mcp`, :mod:`~agentflows.agents.delegation` (sub-agents, sub-flows),
  :mod:`~agentflows.agents.review` (``request_human_review``),
  :mod:`~agentflows.agents.flow_nodes` (other nodes of the Flow, ``nodeTools``), with
  :mod:`~agentflows.agents.approval` for supervised autonomy; :mod:`~agentflows.agents.files`
  (reference files before the conversation); :mod:`~agentflows.agents.egress`, the one address
  guard every connection to a URL a Flow or Agent names goes through.

Invariants:
- importing any module here does not import litellm (it takes seconds), and an agent whose
  model is OpenAI-compatible never imports it; the mcp SDK loads only for ``mcp`` tools;
- no secret value appears in a result, a detail, an error or a message sent to a model;
- a failing tool is an error result for the model, never a failed turn (an unreachable MCP
  server, which leaves the model without its tools, fails the node with a retryable error);
- nothing waits in a process for a human: a pause returns its state to the engine;
- nothing here opens a connection to a URL from a spec except through
  :func:`agentflows.agents.egress.async_client`.
"""
