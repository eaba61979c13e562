"""The next command ``castor status`` and ``castor casts`` print, typed as shown where the operator
typed theirs: it names the project they named (``--cwd``, ``--config``), so it acts on the same
cast. It used to say ``castor abort ID`` alone, which from any other directory answered
``not_found: Unknown pi-materia cast id``."""

from __future__ import annotations

import re
import shlex

from tests.cli.interrupted_cast import castor_cli, interrupted_cast

PROJECTS = "my projects"  # a space: the --cwd in a hint is quoted for the shell


def _typed_as_shown(tmp_path, line: str, where):
    argv = shlex.split(line)
    assert argv[0] == "castor", line
    return castor_cli(tmp_path, *argv[1:], cwd=where)


def test_status_of_a_project_named_with_cwd_advises_commands_that_name_it_too(tmp_path):
    (tmp_path / PROJECTS).mkdir()
    project, run = interrupted_cast(tmp_path / PROJECTS)
    shown = castor_cli(tmp_path, "status", run.name, "--cwd", str(project), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    abort = re.search(r"(castor abort .*?) to stop the cast", shown.stdout)
    assert abort, shown.stdout
    aborted = _typed_as_shown(tmp_path, abort.group(1), tmp_path)
    assert aborted.returncode == 0, aborted.stderr
    assert f"pi-materia cast {run.name} aborted" in aborted.stdout
    # the same from the listing: its recast target is typed as shown
    listed = castor_cli(tmp_path, "casts", "--cwd", str(project), cwd=tmp_path)
    recast = re.search(r"recast: (castor recast .*)$", listed.stdout, re.MULTILINE)
    assert recast, listed.stdout
    assert f"--cwd {shlex.quote(str(project))}" in recast.group(1)


def test_a_hint_in_the_project_itself_stays_short(tmp_path):
    project, run = interrupted_cast(tmp_path)
    shown = castor_cli(tmp_path, "status", run.name, cwd=project)
    assert f"castor abort {run.name} to stop the cast" in shown.stdout
    assert "--cwd" not in shown.stdout


def test_a_cast_run_with_cwd_ends_on_a_resuming_command_that_names_the_project(tmp_path):
    (tmp_path / PROJECTS).mkdir()
    project, _run = interrupted_cast(tmp_path / PROJECTS)  # its esc.json: the next cast is interrupted too
    stopped = castor_cli(tmp_path, "cast", "y", "--agent", f"script:{project / 'esc.json'}", "--quiet",
                         "--cwd", str(project), cwd=tmp_path)
    assert stopped.returncode == 1, stopped.stderr
    resume = re.search(r"`(castor continue [^`]*)` runs it again", stopped.stderr)
    assert resume, stopped.stderr
    assert resume.group(1).endswith(f" --cwd {shlex.quote(str(project))}")
