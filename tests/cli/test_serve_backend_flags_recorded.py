"""A cast a harness starts through ``castor serve --backend ray`` records the backend flags it runs
with in its cli.json, as a ``castor cast --backend ray`` does: ``castor status`` in its project then
names them in the command that resumes it. It had no cli.json at all, so the resume it named ran the
cast on this machine instead of the cluster."""

from __future__ import annotations

import json

import pytest

from castor.actors.materia.api import materia_call
from castor.adapters.stderr_ui import StderrUi
from castor.runtime import HarnessLink, Runtime, SessionInfo
from tests.actors.materia.test_visit_turn import _Agent

pytestmark = pytest.mark.timeout(60)

FLAGS = ["--backend", "ray", "--ray-address", "10.0.0.5:6379", "--ray-hosts", "2"]


def _serve_settings(*flags: str):
    from castor.cli.app import build_parser
    from castor.cli.serve import runtime_settings

    return runtime_settings(build_parser().parse_args(["serve", "--stdio", *flags]))


def test_a_cast_started_through_serve_on_ray_names_its_backend_flags_in_its_resume_hint(tmp_path, monkeypatch,
                                                                                        capsys):
    from castor.cli.app import main

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("CASTOR_TOKEN", "a-token-that-must-never-be-recorded")
    from castor.scaleout.options import scaleout_components

    # the runtime castor serve makes (its components on this machine: no cluster here)
    runtime = Runtime(_serve_settings(*FLAGS, "--token-file", str(tmp_path / "token")),
                      components=scaleout_components(None))
    try:
        agent = _Agent(runtime, "s1", ["held"])
        runtime.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                             HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lambda _line: None)))
        started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})  # as the harness does
        assert agent.sent.wait(10)
        materia_call(runtime, "s1", "abort", {"cast_id": started["cast_id"]})
    finally:
        runtime.shutdown(10)
    cast_id = started["cast_id"]
    note = json.loads((project / ".pi" / "pi-materia" / cast_id / "cli.json").read_text())
    assert note == {"backendFlags": FLAGS}  # the flags alone: no token, nothing else
    monkeypatch.chdir(project)
    assert main(["status", cast_id]) == 0
    out = capsys.readouterr().out
    assert f"castor recast {cast_id} --backend ray --ray-address 10.0.0.5:6379 --ray-hosts 2" in out, out


def test_a_serve_on_this_machine_records_no_note():
    assert _serve_settings().cast_cli_note == {}


def _through_serve(project, flags: list[str], tmp_path, verb: str, params: dict) -> str:
    """``verb`` through the runtime a ``castor serve`` with ``flags`` makes (its components on this
    machine), as a harness asks it; the cast, held at its first turn, is aborted. Its cast id."""
    from castor.scaleout.options import scaleout_components

    runtime = Runtime(_serve_settings(*flags, "--token-file", str(tmp_path / "token")),
                      components=scaleout_components(None))
    try:
        agent = _Agent(runtime, "s1", ["held"])
        runtime.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                             HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lambda _line: None)))
        view = materia_call(runtime, "s1", verb, params)
        assert agent.sent.wait(10)
        materia_call(runtime, "s1", "abort", {"cast_id": view["cast_id"]})
    finally:
        runtime.shutdown(10)
    cast_id: str = view["cast_id"]
    return cast_id


def test_a_cast_resumed_through_a_serve_records_where_that_serve_runs_it(tmp_path, monkeypatch, capsys):
    """A cast started through ``castor serve --backend ray`` and recast through a serve on this
    machine kept its Ray flags in cli.json: ``castor status`` named the cluster for a cast that last
    ran here. The resuming serve now records where it runs the cast: nothing on this machine, its
    own flags on a cluster."""
    from castor.cli.app import main

    project = tmp_path / "project"
    project.mkdir()
    note = lambda cast_id: json.loads((project / ".pi" / "pi-materia" / cast_id / "cli.json").read_text())  # noqa: E731
    cast_id = _through_serve(project, FLAGS, tmp_path, "start", {"request": "x", "loadout": "hello"})
    assert note(cast_id) == {"backendFlags": FLAGS}
    assert _through_serve(project, [], tmp_path, "recast", {"cast_id": cast_id}) == cast_id  # this machine
    assert "backendFlags" not in note(cast_id)
    monkeypatch.chdir(project)
    assert main(["status", cast_id]) == 0
    out = capsys.readouterr().out
    assert f"castor recast {cast_id}" in out and "--backend" not in out, out
    other = ["--backend", "ray", "--ray-address", "10.0.0.6:6379"]
    assert _through_serve(project, other, tmp_path, "recast", {"cast_id": cast_id}) == cast_id  # a cluster again
    assert note(cast_id) == {"backendFlags": other}
