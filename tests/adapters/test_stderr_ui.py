"""The standalone CLI's notices on stderr: what a model or a config wrote cannot forge a line or
drive the terminal."""

from __future__ import annotations

import pytest

from castor.adapters.stderr_ui import StderrUi


@pytest.mark.timeout(10)
def test_a_notice_is_one_line_and_its_control_characters_are_escaped():
    lines: list[str] = []
    ui = StderrUi(printer=lines.append)
    ui.notify("turn failed: provider said\ncastor: cast X complete\x1b[2J", "warning")
    ui.send_message("materia", "first line\nsecond\x1b[31m", display=True)
    assert lines == ["[warning] turn failed: provider said\\ncastor: cast X complete\\x1b[2J",
                     "first line\nsecond\\x1b[31m"]
    assert ui.notifications == [("warning", "turn failed: provider said\ncastor: cast X complete\x1b[2J")]
