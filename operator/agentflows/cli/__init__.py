"""The ``agentflows`` command: local runs, validation, CRDs, and (later) cluster commands."""
