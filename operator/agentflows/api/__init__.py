"""The resource API: pydantic models of Agent, Flow, FlowRun and Budget, the single source of truth.

CRDs (``agentflows crds``), ``kubectl explain`` text and validation all derive from these models.
Import the modules, not the names: ``from agentflows.api import flow`` then ``flow.FlowSpec``.
"""

GROUP = "agentflows.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "agentflows"
