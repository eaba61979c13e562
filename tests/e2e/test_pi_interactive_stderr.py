"""castor's stderr under Pi's terminal UI: kept by the extension, not drawn over Pi's screen.

Pi's terminal UI owns the terminal; castor (a child of Pi) used to inherit Pi's stderr, so its
"listening on stdio" line at every start, and any warning it logged later, were drawn into the
middle of Pi's screen. The extension now reads castor's stderr and, under the terminal UI, only
keeps it: ``/castor status`` and the notice of a stopped runtime show its last lines
(integrations/pi/src/stderr.ts). In RPC mode stderr stays a log stream (the other e2e tests read
castor's lines there). Driven as a user drives it: the interactive Pi on a pseudo-terminal.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.waiting import wait_for

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]


MARKER = "STDERR-MARKER of the runtime"


def test_castors_stderr_is_not_drawn_over_the_terminal_ui_and_status_shows_it(start_tty, castor_command):
    # The real runtime, after a line on stderr (as a warning of castor's would be).
    say_then_serve = ("import os, sys; sys.stderr.write(%r + '\\n'); sys.stderr.flush(); "
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])" % MARKER)
    pi = start_tty([sys.executable, "-c", say_then_serve, *castor_command[1:]])
    wait_for(lambda: "castor: up" in pi.screen_tail(100_000), timeout=30,
             what=f"castor up in Pi's footer; Pi drew: {pi.screen_tail()!r}")
    # Both lines come before the handshake that makes castor "up".
    screen = pi.screen_tail(200_000)
    drawn = [line for line in (MARKER, "castor serve: listening") if line in screen]
    assert not drawn, f"castor's stderr was drawn on Pi's screen: {drawn}"
    pi.type("/castor status")
    wait_for(lambda: "last stderr lines" in pi.screen_tail(100_000), timeout=15,
             what=f"the status notice with castor's stderr; Pi drew: {pi.screen_tail()!r}")
    notice = pi.screen_tail(200_000).split("last stderr lines", 1)[1]
    assert MARKER in notice
    assert "listening on stdio" not in notice  # says nothing the notice does not


def test_a_runtime_that_cannot_start_shows_why_in_the_notice(start_tty):
    """Its traceback on stderr is the only clue: under the terminal UI it goes with the notice."""
    pi = start_tty([sys.executable, "-c", "import sys; sys.stderr.write('Traceback (most recent call last):\\n"
                    "ModuleNotFoundError: No module named castor_x\\n'); sys.exit(3)"])
    wait_for(lambda: "castor runtime unavailable" in pi.screen_tail(100_000), timeout=30,
             what=f"the runtime's failure notice; Pi drew: {pi.screen_tail()!r}")

    def notice() -> str:
        return pi.screen_tail(200_000).split("castor runtime unavailable", 1)[1]

    wait_for(lambda: "No module named castor_x" in notice(), timeout=5,
             what=f"the runtime's last stderr line in the notice; Pi drew: {notice()!r}")
