"""The repository layout never lets a file shadow a standard-library module.

A script run as ``python bench/engine.py`` puts ``bench/`` first on ``sys.path``; pytest puts the
repository root there. Any ``X.py`` (or package ``X/``) beside them named after a standard module
replaces that module for everything the script imports: ``bench/operator.py`` once broke every
benchmark (``cannot import name 'eq' from partially initialized module 'operator'``). Only modules
inside the ``agentflows`` package are safe, because they are imported by their dotted name.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "agentflows"


def _tracked_python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in listed]


def test_no_file_outside_the_package_is_named_after_a_standard_module() -> None:
    shadows = [
        str(path.relative_to(REPO))
        for path in _tracked_python_files()
        if path.stem in sys.stdlib_module_names and PACKAGE not in path.parents
    ]
    assert shadows == [], f"rename these, they shadow the standard library: {shadows}"


def test_no_directory_where_scripts_run_holds_a_package_named_after_a_standard_module() -> None:
    script_dirs = {path.parent for path in _tracked_python_files() if PACKAGE not in path.parents}
    shadows = [
        str(child.relative_to(REPO))
        for directory in script_dirs | {REPO}
        for child in directory.iterdir()
        if child.is_dir()
        and (child / "__init__.py").exists()
        and child.name in sys.stdlib_module_names
    ]
    assert shadows == [], f"rename these packages, they shadow the standard library: {shadows}"
