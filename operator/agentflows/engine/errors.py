"""Errors that say once whether trying again may help.

::

    Exception
     └── AgentflowsError      .retryable: may the same work succeed if it is tried again?
          ├── PermanentError   no (retryable False): the spec, the input or the stored state
          │                    is wrong, e.g. a malformed offload reference, a stopped run
          ├── TemporaryError   yes (retryable True): a rate limit, a 5xx, a timeout
          └── CapabilityError  (engine.capabilities) an agent, model or tool call failed; each
                               one says whether it is temporary and which service (.source)

Who acts on it: the engine retries a node on a retryable CapabilityError when the node's retry
policy covers its source; the runner ends a run Failed on a permanent error (no new pod can fix
it) and reports a temporary one as a lost attempt, which the operator retries with backoff.
``kube.client.ApiError`` follows the same rule with its own ``retryable`` property.
"""

from __future__ import annotations


class AgentflowsError(Exception):
    """Base of the project's errors; ``retryable`` says whether trying again may help."""

    retryable: bool = False


class PermanentError(AgentflowsError):
    """Trying again cannot help: something must change first."""

    retryable = False


class TemporaryError(AgentflowsError):
    """Trying again later may help."""

    retryable = True
