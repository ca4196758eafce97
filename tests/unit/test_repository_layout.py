"""The repository layout: no file shadows a standard-library module; no reference dangles.

A script run as ``python bench/engine.py`` puts ``bench/`` first on ``sys.path``; pytest puts the
repository root there. Any ``X.py`` (or package ``X/``) beside them named after a standard module
replaces that module for everything the script imports: ``bench/operator.py`` once broke every
benchmark (``cannot import name 'eq' from partially initialized module 'operator'``). Only modules
inside the ``agentflows`` package are safe, because they are imported by their dotted name.

A document a file names (``NOTES.md``, ``docs/architecture.md``) must be in the repository.
"""

import re
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


#: A project document named in text: an upper-case name (DESIGN.md, kube/NOTES.md), or the
#: target of a Markdown link ([the architecture](docs/architecture.md#layers)). A lower-case
#: path elsewhere is often a user's file in an example (path: docs/policy.md), not ours.
_DOCUMENT = re.compile(
    r"(?<![\w./-])((?:\.\./|[\w.-]+/)*[A-Z][A-Z_]*\.md)\b"
    r"|\]\(((?:\.\./|[\w.-]+/)*[\w.-]+\.md)(?:#[\w-]*)?\)"
)


def test_every_document_the_tree_refers_to_is_in_the_repository() -> None:
    # Files once sent readers to a DESIGN.md that was never in the repository (issue 10). A
    # path is relative to the file naming it, or to any directory (kube/NOTES.md in prose).
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = []
    for name in tracked:
        if REPO / name == Path(__file__).resolve():
            continue  # this file names a missing document on purpose
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        for reference in {a or b for a, b in _DOCUMENT.findall(text)}:
            relative = (REPO / name).parent.joinpath(reference).resolve()
            found = relative.is_file() or any(
                f"/{path}".endswith(f"/{reference}") for path in tracked
            )
            if not found:
                missing.append(f"{name}: {reference}")
    assert missing == [], f"these documents are not in the repository: {sorted(missing)}"
