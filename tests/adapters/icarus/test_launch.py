"""Launch: argv from trusted settings only, sanitised environment."""

from __future__ import annotations

import os
import stat

from castor.adapters.icarus.launch import WORKER_PROGRAM, build_launch, sanitise_pythonpath
from castor.domain.icarus.settings import IcarusSettings


def settings(**kw):
    return IcarusSettings(**{"icarus_dir": "/opt/h/plugins/icarus", "fabric_dir": "/f", **kw})


def test_pythonpath_sanitised_spec_example(tmp_path):
    cwd = str(tmp_path)
    inherited = os.pathsep.join(["", "rel", "/abs/dep", cwd, os.path.join(cwd, "src"), "/abs/dep"])
    assert sanitise_pythonpath("/opt/h/plugins/icarus", inherited, cwd) == os.pathsep.join(
        ["/opt/h/plugins", "/abs/dep"])


def test_argv_and_env(tmp_path):
    launch = build_launch(settings(python="/usr/bin/python3", hermes_home="/h", state_db_path="db/state.sqlite"),
                          cwd=str(tmp_path), parent_env={"PYTHONPATH": ".:/abs", "HOME": "/home/x"}, home="/home/x")
    assert launch.argv == ("/usr/bin/python3", "-u", WORKER_PROGRAM)
    assert launch.cwd == str(tmp_path)
    env = launch.env
    assert env["PYTHONPATH"] == "/opt/h/plugins" + os.pathsep + "/abs"
    assert env["CASTOR_ICARUS_DIR"] == "/opt/h/plugins/icarus" and env["PYTHONSAFEPATH"] == "1"
    assert (env["FABRIC_DIR"], env["HERMES_AGENT_NAME"], env["FABRIC_PROJECT_ID"]) == ("/f", "pi-agent", "unknown")
    assert env["HERMES_HOME"] == "/h"
    assert env["STATE_DB_PATH"] == os.path.join(str(tmp_path), "db/state.sqlite")
    assert env["HOME"] == "/home/x"  # the rest of the parent environment is kept


def test_unset_hermes_home_is_not_inherited(tmp_path):
    launch = build_launch(settings(), cwd=str(tmp_path), parent_env={"HERMES_HOME": "/stale"})
    assert "HERMES_HOME" not in launch.env and "STATE_DB_PATH" not in launch.env


def test_path_valued_python_resolves_against_cwd(tmp_path):
    launch = build_launch(settings(python=".venv/bin/python"), cwd=str(tmp_path), parent_env={})
    assert launch.argv[0] == os.path.join(str(tmp_path), ".venv/bin/python")


def test_bare_python_never_resolves_into_the_project(tmp_path):
    project = tmp_path / "proj"
    (project / "bin").mkdir(parents=True)
    evil = project / "bin" / "python3"
    evil.write_text("#!/bin/sh\necho pwned\n")
    evil.chmod(evil.stat().st_mode | stat.S_IEXEC)
    good_dir = tmp_path / "system"
    good_dir.mkdir()
    good = good_dir / "python3"
    good.write_text("#!/bin/sh\n")
    good.chmod(good.stat().st_mode | stat.S_IEXEC)
    path = os.pathsep.join([".", "bin", str(project / "bin"), str(good_dir)])
    launch = build_launch(settings(), cwd=str(project), parent_env={"PATH": path})
    assert launch.argv[0] == str(good)


def test_entries_that_reach_the_project_through_a_link_are_the_project(tmp_path):
    """A PATH or PYTHONPATH entry through a symlink to the project, or a project opened by a
    symlinked path with entries naming its real directory, was kept: the project's own
    ``bin/python3`` became the worker and its ``json.py`` was imported before trust."""
    project = tmp_path / "proj"
    (project / "bin").mkdir(parents=True)
    (project / "src").mkdir()
    evil = project / "bin" / "python3"
    evil.write_text("#!/bin/sh\necho pwned\n")
    evil.chmod(evil.stat().st_mode | stat.S_IEXEC)
    link = tmp_path / "link"
    link.symlink_to(project)
    good_dir = tmp_path / "system"
    good_dir.mkdir()
    good = good_dir / "python3"
    good.write_text("#!/bin/sh\n")
    good.chmod(good.stat().st_mode | stat.S_IEXEC)
    for cwd, entry in ((project, link), (link, project)):
        assert sanitise_pythonpath("/opt/h/plugins/icarus", os.pathsep.join([str(entry), str(entry / "src"), "/abs"]),
                                   str(cwd)) == os.pathsep.join(["/opt/h/plugins", "/abs"])
        launch = build_launch(settings(), cwd=str(cwd),
                              parent_env={"PATH": os.pathsep.join([str(entry / "bin"), str(good_dir)])})
        assert launch.argv[0] == str(good), (cwd, entry)
