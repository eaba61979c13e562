"""The guarantee mutant suite's own bookkeeping (the mutants themselves run in .ci/mutants.sh).

Cheap and static: every mutant's snippet still matches its file exactly once (code drift shows
up in the ordinary test run too), every named test exists, and docs/reliability.md names every
mutant.
"""

from __future__ import annotations

import re
from pathlib import Path

from tools.mutants.mutants import MUTANTS
from tools.mutants.run import drift

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_snippet_matches_its_file_exactly_once():
    assert drift(MUTANTS) == []


def test_every_test_a_mutant_names_exists():
    missing = []
    for mutant in MUTANTS:
        for node in mutant.tests:
            file, _, name = node.partition("::")
            path = ROOT / file
            if not path.is_file():
                missing.append(node)
            elif name and not re.search(rf"^def {re.escape(name)}\(", path.read_text(), re.MULTILINE):
                missing.append(node)
    assert missing == []


def test_docs_reliability_names_every_mutant():
    text = (ROOT / "docs" / "reliability.md").read_text()
    assert [m.name for m in MUTANTS if f"`{m.name}`" not in text] == []
