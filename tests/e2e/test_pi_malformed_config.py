"""A malformed ``.pi/pi-materia.json`` in real Pi: the ``/materia`` notice names the file once.

It read ``materia: invalid materia config: [invalid-json] /p/.pi/pi-materia.json#/: malformed
JSON in /p/.pi/pi-materia.json at line 2 column 8: Expecting value [invalid_config]``: the file twice
on the one line Pi's terminal UI shows of a notice, pushing the line and column off it.
"""

from __future__ import annotations

import pytest

from .test_pi_castor_e2e import up

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]


def test_a_malformed_project_config_is_named_once_in_the_notice(start_pi, castor_command, tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text('{"activeLoadout": "hello",\n  "x": }')
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    for command in ("/materia grid", "/materia cast build it"):
        start = pi.command(command)
        note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=start)
        text = str(note.get("message"))
        assert text.count(".pi/pi-materia.json") == 1, text
        assert "line 2 column 8" in text and "[invalid_config]" in text, text
