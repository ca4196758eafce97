"""The ``agentflows`` command: local runs, validation, CRDs, runs and requests on a cluster."""
