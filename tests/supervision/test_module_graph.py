"""supervision's modules import each other without a cycle, and kinds.py is the bottom one."""

from __future__ import annotations

import grimp
import pytest


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("castor", cache_dir=None)


def test_no_import_cycle_among_supervision_modules(graph):
    modules = sorted(m for m in graph.modules if m.startswith("castor.supervision."))
    both_ways = [(a, b) for i, a in enumerate(modules) for b in modules[i + 1:]
                 if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)]
    assert both_ways == []


def test_kinds_imports_nothing_of_supervision(graph):
    imported = graph.find_modules_directly_imported_by("castor.supervision.kinds")
    assert not [m for m in imported if m.startswith("castor.supervision")]


def test_each_module_imports_only_those_listed_above_it_in_the_docs(graph):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "supervision.md").read_text()
    order = [f"castor.supervision.{name}" for name in re.findall(r"^\| `(\w+)\.py` \|", text, re.M)]
    modules = sorted(m for m in graph.modules if m.startswith("castor.supervision."))
    assert sorted(order) == modules
    for index, module in enumerate(order):
        imported = {m for m in graph.find_modules_directly_imported_by(module) if m.startswith("castor.supervision.")}
        assert imported <= set(order[:index]), (module, imported - set(order[:index]))
