"""The controller runtime's import contract names every other module of controller/ (issue 21).

import-linter's forbidden contract lists modules, not "everything but": a module added to
``controller/`` and not to the list could be imported by ``controller/runtime/`` unseen. This
test keeps the list and the directory the same.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTROLLER = REPO / "operator" / "agentflows" / "controller"
NAME = "The controller runtime never imports the reconcilers or the rest of the operator"


def test_the_runtime_contract_forbids_every_module_of_the_controller_but_the_runtime() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == NAME]
    assert contract["source_modules"] == ["agentflows.controller.runtime"]
    forbidden = {m for m in contract["forbidden_modules"] if m.startswith("agentflows.controller.")}
    modules = {
        f"agentflows.controller.{path.stem}"
        for path in CONTROLLER.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and path.name not in ("runtime", "__pycache__"))
    }
    assert forbidden == modules, "add the new module of controller/ to the contract's list"
