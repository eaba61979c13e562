"""Paths built from ids and model output never leave the cast's directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from castor.actors.materia.api import materia_call
from castor.domain.materia.config import ConfigError
from castor.messages.errors import CastorError, Forbidden

from .helpers import open_session, verdict, wait_status, write_project_config

HOSTILE = ["../../etc", "/etc/passwd", "a/b", "..", ".", "x\x00y", "C:\\evil", "a" * 200, "../" + "x" * 10]


@pytest.mark.parametrize("verb", ["status", "recast", "revive", "abort"])
def test_hostile_cast_ids_are_forbidden_and_touch_nothing(runtime_factory, project, verb):
    rt = runtime_factory()
    open_session(rt, "s1", project, ["x"])
    for cast_id in HOSTILE:
        with pytest.raises(Forbidden):
            materia_call(rt, "s1", verb, {"cast_id": cast_id})
    assert not (project / ".pi").exists() or not any(project.parent.glob("etc*"))


def test_hostile_work_item_ids_stay_inside_the_run_dir(runtime_factory, project, tmp_path):
    items = [{"id": "../../../../escaped", "title": "../up", "description": "d", "acceptance": []},
             {"id": "/abs/olute", "title": "t", "description": "d", "acceptance": []}]
    plan = json.dumps({"summary": "p", "workItems": items})
    script = {"Socket-3": [plan], "Socket-4": ["b1", "b2"], "Socket-5": [verdict(True), verdict(True)],
              "Socket-7": ["done"]}
    rt = runtime_factory()
    open_session(rt, "s1", project, script)
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "build"})
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete", view
    run_dir = Path(view["run_dir"]).resolve()
    written = [p.resolve() for p in tmp_path.rglob("*") if p.is_file()]
    outside = [p for p in written if not p.is_relative_to(run_dir) and p.name not in (".gitignore",)
               and not p.is_relative_to(project / ".pi" / "pi-materia")]
    assert outside == []
    names = {p.name for p in (run_dir / "sockets" / "Socket-4").iterdir()}
    assert all("/" not in n and not n.startswith(".") for n in names) and len(names) == 2
    assert not (tmp_path / "escaped").exists() and not Path("/abs").exists()


def test_hostile_socket_ids_are_refused_by_config_before_any_file_is_written(runtime_factory, project):
    write_project_config(project, {"activeLoadout": "evil", "loadouts": {"evil": {"entry": "../x", "sockets": {
        "../x": {"type": "agent", "materia": "greeter"}}}}})
    rt = runtime_factory()
    open_session(rt, "s1", project, ["x"])
    with pytest.raises(CastorError) as err:
        materia_call(rt, "s1", "start", {"request": "x"})
    assert err.value.code == "invalid_config" and isinstance(err.value, ConfigError)
    assert not (project / ".pi" / "pi-materia").exists()
