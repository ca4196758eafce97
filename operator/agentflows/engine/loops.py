"""Loops of a flow: which edges go back, the nodes each loop runs again, and their rules.

A depth-first walk from the start node (successors in edge order) finds the *back edges*: an
edge to a node still on the walk's path. The target of a back edge is the loop's *head* (the
node it re-enters); its *body* is every node on a path from the head to a back edge's source.
The run loop schedules the graph without its back edges (a DAG) and, when every node of a body
has settled and a back edge was taken, starts the next iteration of the body.

Rules (:func:`problems`):
- every loop has an exit: a branch node in its body with a case (or default) leading out of it;
- loops do not share nodes (no nested or overlapping loops in one flow; a sub-flow called from
  a loop may loop itself);
- the head's ``maxIterations`` (else ``spec.limits.maxIterations``) bounds how many times the
  body runs; one more re-entry fails the run with reason LoopIterationLimitExceeded.

Records (:func:`fold`): iteration ``n`` of a body node is recorded at ``<id>#<n>``. The store
keeps the first iteration and the latest :data:`~agentflows.api.flowrun.ITERATIONS_KEPT`; the
ones between are folded into one record per body node, ``<id>#2-<last>``: its phase
(Succeeded when any of them succeeded, else Skipped), the output of the latest that succeeded
(what ``.nodes.<id>`` then was), the first start and the last finish, the sum of the attempts
and usage of every record folded (map items and sub-flow steps of those iterations included,
so usage totals and ``limits.maxNodeExecutions`` still count them), and in ``detail.folded``
how many iterations succeeded and were skipped. ``.iterations.<id>`` lists the iterations kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence

from agentflows.api import common
from agentflows.api import flowrun as flowrun_api

Phase = flowrun_api.NodePhase


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop: its head, the sources of its back edges, its body, and its bound."""

    head: str
    sources: tuple[str, ...]
    body: frozenset[str]
    path: tuple[str, ...]
    max_iterations: int

    def describe(self) -> str:
        """``draft -> review -> decide -> draft``, for messages."""
        return " -> ".join(self.path)


def back_edges(start: str, successors: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """Edges from a node to one on the depth-first path from ``start`` that reaches it."""
    found: list[tuple[str, str]] = []
    on_path: set[str] = set()
    seen: set[str] = set()
    stack: list[tuple[str, int]] = [(start, 0)]
    on_path.add(start)
    seen.add(start)
    while stack:
        node, index = stack[-1]
        nexts = successors.get(node, ())
        if index == len(nexts):
            stack.pop()
            on_path.discard(node)
            continue
        stack[-1] = (node, index + 1)
        succ = nexts[index]
        if succ in on_path:
            found.append((node, succ))
        elif succ not in seen:
            seen.add(succ)
            on_path.add(succ)
            stack.append((succ, 0))
    return found


def _reach(starts: Sequence[str], step: Callable[[str], Sequence[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(step(node))
    return seen


def _path(
    head: str, source: str, body: frozenset[str], dag: Mapping[str, Sequence[str]]
) -> list[str]:
    """A path head -> ... -> source inside the body, then back to head."""
    previous: dict[str, str] = {}
    queue = [head]
    while queue:
        node = queue.pop(0)
        if node == source:
            break
        for succ in dag.get(node, ()):
            if succ in body and succ not in previous and succ != head:
                previous[succ] = node
                queue.append(succ)
    path = [source]
    while path[-1] != head:
        path.append(previous[path[-1]])
    return [*reversed(path), head]


def find(
    start: str,
    successors: Mapping[str, Sequence[str]],
    max_iterations: Callable[[str], int],
) -> tuple[dict[str, Loop], set[tuple[str, str]]]:
    """The loops of a graph by head, and its back edges."""
    backs = back_edges(start, successors)
    dag = {n: [s for s in succ if (n, s) not in backs] for n, succ in successors.items()}
    preds: dict[str, list[str]] = {}
    for node, succ in dag.items():
        for target in succ:
            preds.setdefault(target, []).append(node)
    loops: dict[str, Loop] = {}
    for head in dict.fromkeys(h for _, h in backs):
        sources = tuple(s for s, h in backs if h == head)
        body = frozenset(
            _reach([head], lambda n: dag.get(n, ())) & _reach(sources, lambda n: preds.get(n, ()))
        )
        path = tuple(_path(head, sources[0], body, dag))
        loops[head] = Loop(head, sources, body, path, max_iterations(head))
    return loops, set(backs)


def problems(
    loops: Mapping[str, Loop],
    successors: Mapping[str, Sequence[str]],
    is_branch: Callable[[str], bool],
) -> list[str]:
    """What is wrong with a flow's loops: no exit, or sharing nodes with another loop."""
    found: list[str] = []
    owner: dict[str, str] = {}
    for loop in loops.values():
        exits = [
            n for n in loop.body if is_branch(n) and any(s not in loop.body for s in successors[n])
        ]
        if not exits:
            found.append(
                f"loop {loop.describe()} has no exit: a loop must pass through a branch node "
                "with a case or default leading out of it"
            )
        for node in sorted(loop.body):
            if node in owner:
                found.append(
                    f'node "{node}" is in two loops (re-entering "{owner[node]}" and '
                    f'"{loop.head}"): loops of one flow must not share nodes'
                )
            owner.setdefault(node, loop.head)
    return found


#: Longest span of iterations a fold finds the keys of by each iteration's prefix; a longer one
#: (a resumed run whose store holds many unfolded iterations) by the node's prefix.
_SHORT_SPAN = 16


def _earlier_fold(
    records: Mapping[str, flowrun_api.NodeStatus], base: str, last: int
) -> tuple[str, int] | None:
    """The key of node key ``base``'s fold (``<base>#2-<n>``) and its last iteration ``n``.

    Looked up first as the previous iteration's fold, up to ``last - 1``.
    """
    expected = f"{base}#2-{last - 1}"
    if expected in records:
        return expected, last - 1
    start = base + "#2-"
    for key in (k for k in records if k.startswith(start)):
        found = flowrun_api.folded_range(key)
        if found is not None and found[0] == base:
            return key, found[2]
    return None


def _iteration_keys(
    records: Mapping[str, flowrun_api.NodeStatus], base: str, span: range
) -> list[str]:
    """Keys of iterations ``span`` of node key ``base``, in the records' order.

    Iteration n's are ``<base>#<n>``, its map items ``<base>#<n>[i]`` and its sub-flow steps
    ``<base>#<n>/...``. This runs every iteration: a short span is found by a prefix test of
    each key, so the kept iterations' keys are not parsed each time.
    """
    starts = tuple(f"{base}#{n}" for n in span) if len(span) <= _SHORT_SPAN else (base + "#",)
    found = []
    for key in (k for k in records if k.startswith(starts)):
        rest = key[len(base) + 1 :]
        digits = len(rest) - len(rest.lstrip("0123456789"))
        if digits and rest[digits : digits + 1] in ("", "[", "/") and int(rest[:digits]) in span:
            found.append(key)
    return found


def fold(
    records: Mapping[str, flowrun_api.NodeStatus],
    prefix: str,
    loop: Loop,
    iteration: int,
    leaves: Collection[str],
) -> tuple[dict[str, flowrun_api.NodeStatus], list[str], range]:
    """Fold the loop's iterations from 2 to ``iteration - ITERATIONS_KEPT`` (see module doc).

    ``leaves`` are the body nodes whose kind never records anything beneath its own record
    (no map items, no sub-flow steps): their iterations are looked up, not searched for.
    Returns the folded records by key, the keys they replace (an earlier fold's among them)
    and the iterations newly folded; nothing when every such iteration is folded already.
    """
    last = iteration - flowrun_api.ITERATIONS_KEPT
    if last < 2:
        return {}, [], range(0)
    folded: dict[str, flowrun_api.NodeStatus] = {}
    removed: list[str] = []
    start = last + 1
    for node_id in sorted(loop.body):
        base = prefix + node_id
        found = _earlier_fold(records, base, last)
        earlier = found[0] if found else None
        iterations = range(found[1] + 1 if found else 2, last + 1)
        own = [k for n in iterations if (k := f"{base}#{n}") in records]
        keys = own if node_id in leaves else _iteration_keys(records, base, iterations)
        if not keys:
            continue
        start = min(start, iterations.start)
        previous = records[earlier] if earlier else None
        every = [records[k] for k in keys]
        folded[f"{base}#2-{last}"] = _folded(previous, [records[k] for k in own], every)
        removed += [*([earlier] if earlier else []), *keys]
    return folded, removed, range(start, last + 1)


def _folded(
    previous: flowrun_api.NodeStatus | None,
    own: list[flowrun_api.NodeStatus],
    every: list[flowrun_api.NodeStatus],
) -> flowrun_api.NodeStatus:
    """One record standing for a node's folded iterations (``own``, in order) and ``previous``."""
    counts = dict((previous.detail or {}).get("folded") or {}) if previous else {}
    for record in own:
        name = "succeeded" if record.phase == Phase.SUCCEEDED else "skipped"
        counts[name] = counts.get(name, 0) + 1
    succeeded = [r for r in own if r.phase == Phase.SUCCEEDED]
    output = succeeded[-1].output if succeeded else previous.output if previous else None
    records = [*([previous] if previous else []), *every]
    usage = None
    for record in records:
        if record.usage is not None:
            usage = (usage or common.Usage()).add(record.usage)
    starts = [r.started_at for r in records if r.started_at]
    ends = [r.finished_at for r in records if r.finished_at]
    return flowrun_api.NodeStatus(
        phase=Phase.SUCCEEDED if counts.get("succeeded") else Phase.SKIPPED,
        started_at=min(starts) if starts else None,
        finished_at=max(ends) if ends else None,
        attempts=sum(r.attempts for r in records),
        output=output,
        usage=usage,
        detail={"folded": counts},
    )
