"""The one error of the Agent Spec layer: a document that cannot be used, with every problem."""

from __future__ import annotations

from agentflows.api import documents, errors


class SpecInvalid(errors.AgentflowsError):
    """An Agent Spec document with problems; each names where it is and what is wrong."""

    def __init__(self, problems: list[documents.Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def problem(path: str, message: str) -> documents.Problem:
    """A Problem at an Agent Spec path (snake_case, as the document spells it)."""
    return documents.Problem(path, message)
