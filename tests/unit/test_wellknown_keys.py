"""Label and annotation keys, the API version, JSON pointers and wire names: one owner each."""

from __future__ import annotations

import re
from pathlib import Path

from agentflows import api as api_group
from agentflows.api import common, wellknown
from agentflows.api import flowrun as flowrun_api

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "agentflows"
#: Where "agentflows.io..." may be written as a literal: the group and version, the key list
#: itself, and the models' ``apiVersion: Literal[...]`` (a Literal cannot name a constant).
OWNERS = {"api/__init__.py", "api/wellknown.py"}
#: A string that begins with the group: a key, an apiVersion, the group alone (``apiGroups``),
#: an API path, the start of an f-string.
LITERAL = re.compile(r"""["'](/apis/)?agentflows\.io(/[a-z0-9-]*)?["'{]""")


def test_no_module_but_the_owner_spells_a_label_annotation_or_api_version() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in OWNERS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if LITERAL.search(line) and "Literal[" not in line and "default=" not in line:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


def test_keys_are_agentflows_or_kubernetes_recommended_and_distinct_per_meaning() -> None:
    keys = {n: v for n, v in vars(wellknown).items() if n.isupper() and n != "MANAGER"}
    assert all(v.startswith(("agentflows.io/", "app.kubernetes.io/")) for v in keys.values())
    assert len(set(keys.values())) == len(keys)
    assert api_group.API_VERSION == "agentflows.io/v1alpha1"


def test_json_pointers_escape_tilde_and_slash_and_wire_names_are_camel_case() -> None:
    assert common.json_pointer("status", "requests", "a/b~c") == "/status/requests/a~1b~0c"
    assert common.wire_name(flowrun_api.HumanRequest, "decided_by") == "decidedBy"
    assert common.wire_name(flowrun_api.HumanRequest, "schema_") == "schema"
    assert {"Succeeded", "Failed", "Cancelled"} == flowrun_api.TERMINAL_PHASES
