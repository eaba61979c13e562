"""castor's stderr under Pi's terminal UI: kept by the extension, not drawn over Pi's screen.

Pi's terminal UI owns the terminal; castor (a child of Pi) used to inherit Pi's stderr, so its
"listening on stdio" line at every start, and any warning it logged later, were drawn into the
middle of Pi's screen. The extension now reads castor's stderr and, under the terminal UI, only
keeps it: ``/castor status`` and the notice of a stopped runtime show its last lines
(integrations/pi/src/stderr.ts). In RPC mode stderr stays a log stream (the other e2e tests read
castor's lines there). Driven as a user drives it: the interactive Pi on a pseudo-terminal.
"""

from __future__ import annotations

import pytest

from tests.support.waiting import wait_for

from .conftest import python_env
from .pi_rpc import write_agent_dir
from .pi_tty import PiTty

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]


def test_castors_stderr_is_not_drawn_over_the_terminal_ui_and_status_shows_it(pi_install, fake_llm,
                                                                              castor_command, tmp_path):
    agent_dir = tmp_path / "agent"
    write_agent_dir(agent_dir, fake_llm.base_url)
    project = tmp_path / "project"
    project.mkdir()
    pi = PiTty(pi_install, cwd=project, agent_dir=agent_dir, session_dir=tmp_path / "sessions",
               castor_command=castor_command, env={**python_env(), "HOME": str(tmp_path / "home")})
    try:
        wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
                 what=f"castor up in Pi's footer; Pi drew: {pi.screen_tail()!r}")
        # castor prints its "listening" line before it answers the handshake that makes it "up".
        assert "castor serve: listening" not in pi.screen_tail(100_000), "castor's stderr was drawn on Pi's screen"
        pi.type("/castor status")
        wait_for(lambda: "last stderr lines" in pi.screen_tail(100_000), timeout=15,
                 what=f"the status notice with castor's stderr; Pi drew: {pi.screen_tail()!r}")
        screen = pi.screen_tail(200_000)
        # Only inside the notice (after "last stderr lines:"), never as a line of its own.
        before_notice = screen[:screen.index("last stderr lines")]
        assert "castor serve: listening" not in before_notice, "castor's stderr was drawn on Pi's screen"
        assert "listening on stdio" in screen[screen.index("last stderr lines"):]
    finally:
        pi.close()
