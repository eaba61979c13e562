"""castor's human log format: one line a record, whatever text a peer put in the message."""

from __future__ import annotations

import io

import pytest
from loguru import logger

from castor.logs import configure_logging


@pytest.fixture
def human_log():
    sink = io.StringIO()
    configure_logging("DEBUG", json=False, sink=sink)
    yield sink
    configure_logging("ERROR", json=False)


@pytest.mark.timeout(10)
def test_a_newline_or_an_escape_a_peer_chose_does_not_start_a_line_or_reach_the_terminal(human_log):
    logger.warning("notification {!s} failed", "x\n00:00:00.000 INFO     - forged\r\x1b[2J\x7f")
    lines = human_log.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith("notification x\\n00:00:00.000 INFO     - forged\\r\\x1b[2J\\x7f failed")


@pytest.mark.timeout(10)
def test_a_traceback_still_follows_its_record_on_lines_of_its_own(human_log):
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("handler\nfailed")
    lines = human_log.getvalue().splitlines()
    assert lines[0].endswith("handler\\nfailed") and lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"
