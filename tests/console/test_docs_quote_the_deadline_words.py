"""docs/operations.md quotes the words ``castor inspect`` and the console print for a deadline; an
operator who greps the output for them (or writes an alert on the JSON log's text) finds them as
quoted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]


def test_the_deadline_words_the_docs_quote_are_the_ones_printed():
    from castor.console.terminal import deadline_words

    text = " ".join((ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split())
    ahead = re.search(r'"deadline in (\d+\.\d) ?s"', text)
    passed = re.search(r'"deadline passed (\d+\.\d) ?s ago"', text)
    assert ahead and passed, "operations.md quotes both deadline words"
    assert ahead.group(0).strip('"') == deadline_words({"deadline_in_s": float(ahead.group(1))})
    assert passed.group(0).strip('"') == deadline_words({"deadline_in_s": -float(passed.group(1))})
