"""ServerTool implementations for bench/agentspec_conformance.py, given to both runtimes.

agentflows takes them as ``--tools`` does (each public function by name, run in the python
tool's subprocess); WayFlow as its ``tool_registry``. Plain functions of their inputs only.
"""

from __future__ import annotations


def get_weather(city: str) -> dict[str, object]:
    """A weather report: one declared output (``weather``) is read from the object by name."""
    return {"temperature": 22, "weather": f"Sunny in {city}"}


def double(number: int) -> int:
    """Twice the number (a bare value for the one output ``doubled``)."""
    return number * 2


def split_name(name: str) -> dict[str, str]:
    """A full name's first and last parts (two outputs)."""
    first, _, last = name.partition(" ")
    return {"first": first, "last": last}


def shout(text: str) -> str:
    """The text in capitals (a bare string result for one output)."""
    return text.upper()


def fail(text: str) -> str:
    """Always raises (a CatchExceptionNode catches it)."""
    raise RuntimeError(f"cannot handle {text}")
