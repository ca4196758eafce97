"""Implementations of ServerTools given outside the document, for the importer.

Agent Spec leaves a ServerTool's code to the runtime. A document may carry it as a script in
``metadata.agentflows.python``; otherwise it comes from a Python module (``agentflows run
doc.yaml --tools mytools.py``, :func:`read_module`): each public function (``def`` or ``async
def`` at the top level, name not starting with ``_``) implements the ServerTool of its name. The
module's text is embedded in the tool's script, so the call runs as any python tool does (a
subprocess, JSON arguments in, the JSON of the return value out, recorded like every call) and
an imported resource holds all it needs on a cluster.

Under ``--dry-run`` the mock answers every tool (``agents/mock.py``), so a ServerTool without
an implementation is accepted (:attr:`Implementations.mock_missing`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentflows.api import errors

#: The script calling function ``NAME`` of the embedded module: keyword arguments by the
#: tool's inputs, a coroutine awaited, the return value printed as JSON.
_CALL = """
import asyncio, inspect, json, sys
namespace = {"__name__": "agentflows_tools"}
exec(compile(SOURCE, FILENAME, "exec"), namespace)
result = namespace[NAME](**(json.load(sys.stdin) or {}))
if inspect.iscoroutine(result):
    result = asyncio.run(result)
print(json.dumps(result))
"""


class ModuleError(errors.AgentflowsError, ValueError):
    """A ``--tools`` module that cannot be read or parsed."""


@dataclasses.dataclass(frozen=True)
class ToolModule:
    """A module of tool functions: its text, file name and the public functions it defines."""

    source: str
    filename: str
    functions: frozenset[str]


def read_module(path: Path) -> ToolModule:
    """The public functions of the module at ``path`` (parsed, not run: no side effects here)."""
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise ModuleError(f"--tools {path}: not a readable Python module: {exc}") from exc
    names = frozenset(
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and not node.name.startswith("_")
    )
    if not names:
        raise ModuleError(f"--tools {path}: the module defines no public function")
    # The file's name only: tracebacks name it; the resource does not carry this machine's paths.
    return ToolModule(source=source, filename=path.name, functions=names)


@dataclasses.dataclass(frozen=True)
class Implementations:
    """Where ServerTools without a script in the document get one."""

    #: ServerTool name -> the module and the name of its function there.
    calls: Mapping[str, tuple[ToolModule, str]] = dataclasses.field(default_factory=dict)
    #: ``--dry-run``: a ServerTool with no implementation is imported; the mock answers it.
    mock_missing: bool = False

    @classmethod
    def of_module(cls, module: ToolModule, *, mock_missing: bool = False) -> Implementations:
        """Every public function of ``module`` implements the ServerTool of its name."""
        calls = {name: (module, name) for name in module.functions}
        return cls(calls=calls, mock_missing=mock_missing)

    @classmethod
    def of_callables(cls, registry: Mapping[str, Callable[..., Any]]) -> Implementations:
        """A registry ``{tool_name: function}`` of the Python API.

        Each function must be defined at the top level of a module file (it runs, like every
        python tool, in a subprocess that loads that module's text); a lambda, a nested
        function or a builtin is refused with ModuleError.
        """
        calls: dict[str, tuple[ToolModule, str]] = {}
        for tool_name, function in registry.items():
            name = getattr(function, "__name__", "")
            source = inspect.getsourcefile(function) if inspect.isfunction(function) else None
            if source is None or getattr(function, "__qualname__", "") != name:
                raise ModuleError(
                    f"tools[{tool_name!r}]: {function!r} is not a function defined at the top "
                    "level of a module file; define it with def in a module"
                )
            calls[tool_name] = (read_module(Path(source)), name)
        return cls(calls=calls)

    def script(self, tool_name: str) -> str | None:
        """The script calling the function of ``tool_name``; None when there is none."""
        if tool_name not in self.calls:
            return None
        module, function = self.calls[tool_name]
        header = (
            f"SOURCE = {module.source!r}\nFILENAME = {module.filename!r}\nNAME = {function!r}\n"
        )
        return header + _CALL

    def unimplemented(self, tool_name: str) -> str | None:
        """Under ``--dry-run``, the script of a ServerTool with no implementation."""
        if not self.mock_missing:
            return None
        message = f"ServerTool {tool_name!r} has no implementation (imported for --dry-run)"
        return f"raise SystemExit({message!r})\n"


NONE = Implementations()
