"""Building a resource's model builds the models of its fields first, so each is built once.

Models are built on first use (``defer_build``). pydantic builds an outer model by generating
the schemas of the models inside it inline, without keeping them: FlowSpec, used on its own
after Flow, was generated a second time. Each check runs in a fresh interpreter, where no
model is built yet; counted through pydantic's own completeness flag, never a time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_CHECK = """
import json, sys, typing
from pydantic import BaseModel
from agentflows.api import agent, common, flow, flowrun

documents = {
    "Flow": (flow.Flow, {"apiVersion": "agentflows.io/v1alpha1", "kind": "Flow",
             "metadata": {"name": "f"}, "spec": {"nodes": [{"id": "a", "transform": "=1"}]}}),
    "Agent": (agent.Agent, {"apiVersion": "agentflows.io/v1alpha1", "kind": "Agent",
              "metadata": {"name": "a"}, "spec": {"model": {"name": "openai/m"}}}),
    "FlowRun": (flowrun.FlowRun, {"apiVersion": "agentflows.io/v1alpha1", "kind": "FlowRun",
                "metadata": {"name": "r"}, "spec": {"flow": "f"}}),
}
model, document = documents[sys.argv[1]]
model.model_validate(document)

def inside(cls):
    pending = [f.annotation for f in cls.model_fields.values()]
    while pending:
        kind = pending.pop()
        if isinstance(kind, type) and issubclass(kind, common.ApiModel):
            yield kind
        pending.extend(typing.get_args(kind))

seen, unbuilt, todo = set(), [], [model]
while todo:
    cls = todo.pop()
    if cls in seen:
        continue
    seen.add(cls)
    if not cls.__pydantic_complete__:
        unbuilt.append(cls.__qualname__)
    todo.extend(inside(cls))
print(json.dumps({"models": len(seen), "unbuilt": sorted(unbuilt)}))
"""


@pytest.mark.parametrize("kind", ["Flow", "Agent", "FlowRun"])
def test_validating_a_resource_leaves_every_model_of_its_fields_built(kind: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, kind], capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout)
    assert found["models"] > 3
    assert found["unbuilt"] == []
