"""agentflows: LLM-agent workflows as Kubernetes custom resources, or locally from the CLI.

Layers (one-way imports, enforced by import-linter): ``api`` <- ``engine`` <- ``agents`` <-
(``kube``, ``runner``, ``controller``, ``triggers``, ``cli``). See docs/architecture.md.
"""

__version__ = "0.1.0"
