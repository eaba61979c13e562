"""The guarantee mutant suite's own bookkeeping (the mutants themselves run in .ci/mutants.sh).

Every mutant's snippet still matches its file exactly once (code drift shows up in the ordinary
test run too), every named test exists, docs/reliability.md names every mutant, and the runner
tells a killed mutant from a surviving one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_drift_is_reported_for_a_snippet_that_matches_zero_or_several_times():
    from tools.mutants.mutants import mutant

    gone = mutant("gone", "-", [("castor/supervision/mailbox.py", "no such line in the file", "x")], ["tests/x.py"])
    twice = mutant("twice", "-", [("castor/supervision/mailbox.py", "self", "this")], ["tests/x.py"])
    problems = drift([gone, twice])
    assert len(problems) == 2
    assert "gone: the old snippet occurs 0 times" in problems[0] and "twice: the old snippet occurs" in problems[1]


@pytest.mark.timeout(120)
def test_a_mutant_is_killed_when_its_tests_fail_and_survives_when_they_pass():
    from tools.mutants.mutants import mutant
    from tools.mutants.run import run_mutant

    test = "tests/supervision/test_latch.py::test_wait_times_out_until_set_then_returns_at_once"
    broken = mutant("latch-never-set", "-", [("castor/supervision/mailbox.py", "        return self._set\n",
                                              "        return False\n")], [test])
    harmless = mutant("comment-only", "-", [("castor/supervision/mailbox.py", "        return self._set\n",
                                             "        return self._set  # a comment\n")], [test])
    assert run_mutant(broken).verdict == "killed"
    assert run_mutant(harmless).verdict == "survived"
