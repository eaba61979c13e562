"""A ``castor serve`` stopped (SIGTERM) while casts run: its log, at the default level, is where
the operator learns which casts the stop left and how to go on with them."""

from __future__ import annotations

import re
import signal

import pytest

from .conftest import a_served_cast_awaiting_its_turn, castor

pytestmark = pytest.mark.timeout(60)


def test_a_serve_stopped_mid_cast_names_the_cast_it_left_and_the_command_that_says_how_to_go_on(tmp_path, serve):
    """The log said nothing of the cast at the default level (and at INFO only "session closed:
    s1"): the operator who stopped castor could not tell a cast had been cut off, nor where."""
    served, client, project, cast_id = a_served_cast_awaiting_its_turn(tmp_path, serve)
    try:
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(30) == 0
    finally:
        client.close()
    lines = [line for line in served.log().splitlines() if cast_id in line]
    assert len(lines) == 1, served.log()
    assert re.search(rf"WARNING .*stopping: cast {cast_id} of session s1 \({re.escape(str(project))}\) was left "
                     rf"active at Socket-1 \(awaiting the agent's turn", lines[0]), lines[0]
    assert f"castor status {cast_id} --cwd {project} says how to go on" in lines[0], lines[0]
    status = castor(tmp_path, "status", cast_id, "--cwd", str(project))  # what the line says to type
    assert status.returncode == 0 and "RECAST TARGET" in status.stdout, status.stdout + status.stderr
