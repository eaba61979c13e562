"""Config files castor finds by itself (not named on its command line) that another user wrote.

The user's own materia profile (``$PI_MATERIA_PROFILE_DIR/materia.json``) and the global Pi
settings (``$PI_CODING_AGENT_DIR/settings.json``) choose utility commands and the Icarus worker's
Python -- what castor runs as its user, in every session, trusted or not. When such a file
belongs to another user, or anyone may write it (the variable names a shared directory such as
``/tmp/pi``, or a mistyped one), that other user chose those programs. castor does not read it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.icarus.settings_store import load_settings
from castor.adapters.materia.config_loader import load_resolved, read_layer
from castor.domain.materia.config import ConfigError

pytestmark = pytest.mark.timeout(60)

root_only = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                               reason="needs root to make a file of another user")


def _command_config(marker: Path) -> dict:
    return {"activeLoadout": "cmd", "loadouts": {"cmd": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": ["touch", str(marker)],
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}


def _plant(path: Path, doc: dict, how: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    if how == "another-users-file":
        os.chown(path, 65534, 65534)
        path.chmod(0o644)
    elif how == "world-writable":
        path.chmod(0o666)
    else:
        path.chmod(0o644)


@pytest.mark.parametrize("how", [pytest.param("another-users-file", marks=root_only), "world-writable"])
def test_a_materia_profile_another_user_wrote_is_not_read(tmp_path, how):
    """A profile config another user owns (or anyone may write) ran its utility commands as
    castor's user in every cast, an untrusted session's too. It is an ``invalid_config`` now
    (issue ``unsafe-permissions``), naming the file; nothing in it is read."""
    profile = tmp_path / "profile"
    marker = tmp_path / "ran"
    _plant(profile / "materia.json", _command_config(marker), how)
    project = tmp_path / "project"
    project.mkdir()
    with pytest.raises(ConfigError) as refused:
        load_resolved(project, env={"PI_MATERIA_PROFILE_DIR": str(profile)}, home=tmp_path / "home")
    [issue] = [i for i in refused.value.issues if i.code == "unsafe-permissions"]
    assert issue.source == str(profile / "materia.json")
    data, issues = read_layer(profile / "materia.json", owned=True)
    assert data is None and [i.code for i in issues] == ["unsafe-permissions"]
    assert not marker.exists()


def test_the_users_own_profile_is_read_as_before(tmp_path):
    profile = tmp_path / "profile"
    _plant(profile / "materia.json", _command_config(tmp_path / "ran"), "own")
    project = tmp_path / "project"
    project.mkdir()
    resolved = load_resolved(project, env={"PI_MATERIA_PROFILE_DIR": str(profile)}, home=tmp_path / "home")
    assert resolved.pipeline.loadout_name == "cmd"


@pytest.mark.parametrize("how", [pytest.param("another-users-file", marks=root_only), "world-writable"])
def test_global_settings_another_user_wrote_choose_no_python(tmp_path, how):
    """The global settings chose the Icarus worker's Python and package whoever wrote them. A file
    of another user (or that anyone may write) is ignored now, with a warning naming why."""
    agent = tmp_path / "agent"
    _plant(agent / "settings.json", {"piIcarusHook": {"python": str(tmp_path / "evil-python"), "timeoutMs": 4321}},
           how)
    project = tmp_path / "project"
    project.mkdir()
    settings = load_settings(str(project), trusted=False, env={"PI_CODING_AGENT_DIR": str(agent)},
                             home=str(tmp_path / "home"))
    assert settings.python != str(tmp_path / "evil-python") and settings.timeout_ms != 4321
    assert any("global settings ignored" in w and "another user" in w for w in settings.warnings), settings.warnings


def test_the_users_own_global_settings_are_read_as_before(tmp_path):
    agent = tmp_path / "agent"
    _plant(agent / "settings.json", {"piIcarusHook": {"timeoutMs": 4321}}, "own")
    project = tmp_path / "project"
    project.mkdir()
    settings = load_settings(str(project), trusted=False, env={"PI_CODING_AGENT_DIR": str(agent)},
                             home=str(tmp_path / "home"))
    assert settings.timeout_ms == 4321


@pytest.mark.parametrize("how", [pytest.param("another-users-file", marks=root_only), "world-writable"])
def test_context_default_never_rewrites_global_settings_another_user_wrote(tmp_path, how):
    """``/icarus context default hide`` read the global file without the ownership check the
    session's settings get, and wrote it back as castor's user: another user's file became
    castor's user's own, with that user's ``python`` in it, which the next session then ran. The
    write is refused now (``forbidden``), and the file is left as it was."""
    from castor.actors.icarus.component import session_of
    from castor.messages.errors import CastorError
    from castor.runtime import HarnessLink, SessionInfo
    from tests.support.icarus import REFERENCE_ICARUS, IcarusWorldBase, RecordingUi

    world = IcarusWorldBase(tmp_path)
    evil = str(tmp_path / "evil-python")
    _plant(world.global_path, {"piIcarusHook": {"python": evil, "contextDisplay": True}}, how)
    before = (world.global_path.read_bytes(), os.stat(world.global_path).st_uid,
              os.stat(world.global_path).st_mode)
    world.env["ICARUS_DIR"] = str(REFERENCE_ICARUS)  # the package from the environment: Icarus is on
    rt = world.runtime()
    try:
        def open_session(sid: str):
            link = HarnessLink(agent=None, session_log=None, ui=RecordingUi(), classifier=None)
            return session_of(rt.open_session(SessionInfo(session_id=sid, cwd=str(world.project), trusted=False),
                                              link))

        sess = open_session("s1")
        assert sess.config()["state"] == "active"
        with pytest.raises(CastorError) as refused:
            sess.command("context default hide")
        assert refused.value.code == "forbidden" and refused.value.data["path"] == str(world.global_path)
        after = (world.global_path.read_bytes(), os.stat(world.global_path).st_uid,
                 os.stat(world.global_path).st_mode)
        assert after == before
        assert open_session("s2").settings.python != evil
    finally:
        world.close()


@pytest.mark.parametrize("how", [pytest.param("another-users-file", marks=root_only), "world-writable"])
def test_a_trusted_session_never_runs_commands_from_a_project_config_another_user_wrote(tmp_path, how):
    """Trust is the user's word for a project, not for whoever else could write its files: a
    project's ``.pi/pi-materia.json`` another user owns (or every user may write) chose utility
    commands that a trusted session -- ``castor cast`` in that directory, always trusted -- ran as
    castor's user. They are refused (``forbidden``, ``untrusted_project``, naming the file) as an
    untrusted session's are; the rest of the layer (prompts, loadouts) is still read."""
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import Forbidden
    from tests.actors.materia.helpers import make_runtime, open_session

    project = tmp_path / "project"
    marker = tmp_path / "ran"
    _plant(project / ".pi" / "pi-materia.json", _command_config(marker), how)
    runtime = make_runtime()
    try:
        open_session(runtime, "s", project, ["hello"], trusted=True)
        with pytest.raises(Forbidden) as refused:
            materia_call(runtime, "s", "start", {"request": "run it"})
        assert refused.value.data["reason"] == "untrusted_project"
        assert refused.value.data["path"] == str(project / ".pi" / "pi-materia.json")
        assert refused.value.data["sockets"] == ["Socket-1"]
    finally:
        runtime.shutdown(timeout=10)
    assert not marker.exists()
    # The CLI's own session is trusted: `castor cast` there refuses the same way, one line.
    (project / "answers.json").write_text(json.dumps(["hello"]))
    done = subprocess.run([sys.executable, "-m", "castor", "cast", "run it", "--agent", "script:answers.json",
                           "--quiet"], cwd=str(project), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path / "home"), "CASTOR_AGENT": "", "MATERIA_CONFIG": "",
                               "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")})
    assert done.returncode != 0 and "castor: forbidden: " in done.stderr, done.stderr
    assert not marker.exists()


def test_a_trusted_session_runs_the_commands_of_the_users_own_project_config(tmp_path):
    from castor.actors.materia.api import materia_call
    from tests.actors.materia.helpers import make_runtime, open_session, wait_status

    project = tmp_path / "project"
    marker = tmp_path / "ran"
    _plant(project / ".pi" / "pi-materia.json", _command_config(marker), "own")
    runtime = make_runtime()
    try:
        open_session(runtime, "s", project, ["hello"], trusted=True)
        started = materia_call(runtime, "s", "start", {"request": "run it"})
        wait_status(runtime, "s", started["cast_id"], timeout=30)
    finally:
        runtime.shutdown(timeout=10)
    assert marker.exists()


@pytest.mark.parametrize("how", [pytest.param("another-users-file", marks=root_only), "world-writable"])
def test_a_trusted_project_s_settings_another_user_wrote_choose_no_python(tmp_path, how):
    """A trusted project's ``.pi/settings.json`` chooses the Icarus worker's Python: one another
    user owns (or every user may write) chose the program castor ran as its user. It is ignored
    now, as such global settings are, with a warning naming why."""
    project = tmp_path / "project"
    _plant(project / ".pi" / "settings.json",
           {"piIcarusHook": {"python": str(tmp_path / "evil-python"), "timeoutMs": 4321}}, how)
    settings = load_settings(str(project), trusted=True, env={"PI_CODING_AGENT_DIR": str(tmp_path / "agent")},
                             home=str(tmp_path / "home"))
    assert settings.python != str(tmp_path / "evil-python") and settings.timeout_ms != 4321
    assert any("project settings ignored" in w for w in settings.warnings), settings.warnings
    own = tmp_path / "own"
    _plant(own / ".pi" / "settings.json", {"piIcarusHook": {"timeoutMs": 4321}}, "own")
    assert load_settings(str(own), trusted=True, env={"PI_CODING_AGENT_DIR": str(tmp_path / "agent")},
                         home=str(tmp_path / "home")).timeout_ms == 4321


@pytest.mark.parametrize("how", [pytest.param("another-users-file", marks=root_only), "world-writable"])
def test_a_trusted_session_never_resumes_a_saved_cast_another_user_wrote_that_runs_commands(tmp_path, how):
    """A saved cast's ``state.json`` holds its whole config, commands included. One that another
    user owns (or every user may write) -- shipped in a project they may write in, or swapped in
    for castor's own -- was resumed by a trusted session (``castor recast``), which ran its
    commands as castor's user. It is refused now before anything runs (``forbidden``,
    ``untrusted_project``, ``data.cast_id``); castor's own saved cast still resumes."""
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import Forbidden
    from tests.actors.materia.helpers import make_runtime, open_session, wait_status
    from tests.support.waiting import wait_for

    project = tmp_path / "project"
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('ran\\n'); raise SystemExit(3)"]
    config = _command_config(marker)
    config["loadouts"]["cmd"]["sockets"]["Socket-1"]["command"] = command
    _plant(project / ".pi" / "pi-materia.json", config, "own")
    runtime = make_runtime()
    try:
        open_session(runtime, "maker", project, ["x"], trusted=True)
        made = materia_call(runtime, "maker", "start", {"request": "a recastable failure"})
        assert wait_status(runtime, "maker", made["cast_id"])["status"] == "failed"
        runtime.close_session("maker")
        marker.unlink()
        state = project / ".pi" / "pi-materia" / made["cast_id"] / "state.json"
        if how == "another-users-file":
            os.chown(state, 65534, 65534)
        else:
            state.chmod(0o666)
        open_session(runtime, "victim", project, ["x"], trusted=True)
        for verb, params in (("recast", {"cast_id": made["cast_id"]}), ("revive", {"cast_id": made["cast_id"]})):
            with pytest.raises(Forbidden) as refused:
                materia_call(runtime, "victim", verb, params)
            assert refused.value.data["reason"] == "untrusted_project", (verb, refused.value)
            assert refused.value.data["cast_id"] == made["cast_id"]
        assert not marker.exists(), "a command of the saved cast ran"
        os.chown(state, os.geteuid(), os.getegid())
        state.chmod(0o644)
        materia_call(runtime, "victim", "recast", {"cast_id": made["cast_id"]})
        wait_for(marker.exists, timeout=10, what="the recast of castor's own saved cast to run the command")
    finally:
        runtime.shutdown(timeout=10)
