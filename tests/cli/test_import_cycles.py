"""The CLI, the demo and soak (``castor.testing``) and the scale-out backends import each other
in no cycle, and nothing of the scale-out imports the testing or CLI code above it."""

from __future__ import annotations

import grimp
import pytest

pytestmark = pytest.mark.timeout(120)

TOP = ("castor.cli", "castor.testing", "castor.scaleout")


def _strongly_connected(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_no_import_cycle_touches_the_cli_the_testing_code_or_the_scaleout() -> None:
    graph = grimp.build_graph("castor", cache_dir=None)
    cycles = [sorted(c) for c in _strongly_connected(graph) if any(m.startswith(TOP) for m in c)]
    assert cycles == []


def test_the_scaleout_imports_no_testing_or_cli_code() -> None:
    graph = grimp.build_graph("castor", cache_dir=None)
    upward = sorted((m, imported) for m in graph.modules if m.startswith("castor.scaleout")
                    for imported in graph.find_modules_directly_imported_by(m)
                    if imported.startswith(("castor.testing", "castor.cli")))
    assert upward == []
