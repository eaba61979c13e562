"""The CLI, the demo and soak (``castor.testing``) and the scale-out backends import each other
in no cycle, and nothing of the scale-out imports the testing or CLI code above it."""

from __future__ import annotations

import grimp
import pytest

from tests.test_no_import_cycles import import_cycles  # the one Tarjan over grimp's graph

pytestmark = pytest.mark.timeout(120)

TOP = ("castor.cli", "castor.testing", "castor.scaleout")


def test_no_import_cycle_touches_the_cli_the_testing_code_or_the_scaleout() -> None:
    cycles = [sorted(c) for c in import_cycles("castor") if any(m.startswith(TOP) for m in c)]
    assert cycles == []


def test_the_scaleout_imports_no_testing_or_cli_code() -> None:
    graph = grimp.build_graph("castor", cache_dir=None)
    upward = sorted((m, imported) for m in graph.modules if m.startswith("castor.scaleout")
                    for imported in graph.find_modules_directly_imported_by(m)
                    if imported.startswith(("castor.testing", "castor.cli")))
    assert upward == []
