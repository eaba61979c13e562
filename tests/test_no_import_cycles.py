"""castor's modules import each other without cycles.

Over the module-level import graph (grimp; type-checking imports included), no strongly
connected component has more than one module. The cycles other parts of the re-layout still
remove are listed in ``PENDING``: the test fails if a new cycle appears *and* if a listed one
is gone, so the list only ever shrinks (to empty) and never hides a new cycle.
"""

from __future__ import annotations

import grimp
import pytest

pytestmark = pytest.mark.timeout(60)

PENDING: set[frozenset[str]] = set()


def import_cycles(package: str = "castor") -> set[frozenset[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative)."""
    graph = grimp.build_graph(package)
    edges = {module: sorted(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, at = work.pop()
            if at == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            successors = edges.get(node, [])
            if at < len(successors):
                work.append((node, at + 1))
                nxt = successors[at]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_import_cycles_are_only_the_pending_ones() -> None:
    cycles = import_cycles()
    new = cycles - PENDING
    gone = PENDING - cycles
    assert not new, f"new import cycles in castor: {[sorted(c) for c in new]}"
    assert not gone, f"these cycles are gone (or changed): take them out of PENDING: {[sorted(c) for c in gone]}"


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("from cyclepkg import a\n")
    (pkg / "c.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyclepkg") == {frozenset({"cyclepkg.a", "cyclepkg.b"})}
