"""What a live cast keeps in memory: what several casts can share is shared, not copied per cast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from castor.actors.materia.api import materia_call
from tests.actors.materia.helpers import make_runtime, open_session, wait_for, wait_status, write_project_config

pytestmark = pytest.mark.timeout(60)

CONFIG = {"activeLoadout": "one", "materia": {"step": {"prompt": "Do {{request}}.", "tools": "none"}},
          "loadouts": {"one": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "step"}}}}}


def test_sessions_in_one_project_share_its_resolved_config(tmp_path):
    """Two sessions of a runtime in one project: their casts run on one resolved config object
    (and what is derived from it once: its JSON texts), not a copy per session."""
    write_project_config(tmp_path, CONFIG)
    rt = make_runtime()
    try:
        for sid in ("s1", "s2"):
            open_session(rt, sid, tmp_path, {"*": ["ok"]})
            wait_status(rt, sid, materia_call(rt, sid, "start", {"request": "r"})["cast_id"])
        actors = [rt.system.registry.find(rt.session(sid).child("materia")).actor for sid in ("s1", "s2")]
        assert actors[0] is not actors[1]
        assert actors[0]._resolved() is actors[1]._resolved()
    finally:
        rt.shutdown(30)


def _manifest_steps(arts, *, forget: bool) -> bytes:
    """A cast's manifest writes (its start's whole manifest, then entries per transition), with
    ``forget_kept`` between them (a cast waiting for its agent) or not."""
    from castor.adapters.materia.artifacts import CastArtifacts

    assert isinstance(arts, CastArtifacts)
    arts.create()
    start = json.dumps({"castId": arts.cast_id, "request": "naïve ✓ \"quoted\"", "configSource": "x", "entries": [
        {"kind": "context", "artifact": "contexts/Socket-1.md", "timestamp": 1}]})
    arts.write_transition({"manifest.json": start, "contexts/Socket-1.md": "ctx"}, [], [])
    for n in range(1, 4):
        if forget:
            arts.forget_kept()
            assert arts._manifest_body is None
        entries = [{"kind": "socket_output", "socket": f"Socket-{n}", "artifact": f"sockets/Socket-{n}/1.md",
                    "size": 1.5, "note": "ü\u2028", "list": [1, None, True]},
                   {"kind": "context", "artifact": f"contexts/Socket-{n + 1}.md"}]
        arts.write_transition({f"sockets/Socket-{n}/1.md": "out"}, entries, [("socket_complete", {"n": n}, n)])
    return (arts.run_dir / "manifest.json").read_bytes()


def test_a_cast_s_files_object_that_forgot_what_it_kept_writes_the_same_manifest(tmp_path, monkeypatch):
    """forget_kept (a cast waiting for its agent) costs a read of the manifest at the next write,
    and the manifest comes out byte for byte as from an object that kept everything."""
    from castor.adapters.materia.artifacts import CastArtifacts

    monkeypatch.setattr("time.time", lambda: 1_700_000_000.0)  # the entries' timestamps alike
    kept = _manifest_steps(CastArtifacts(tmp_path / "a", "20260101-000000"), forget=False)
    forgetting = CastArtifacts(tmp_path / "b", "20260101-000000")

    def parsed():
        raise AssertionError("the manifest this object wrote was parsed back, not sliced")

    forgetting.read_manifest = parsed  # type: ignore[method-assign]
    forgot = _manifest_steps(forgetting, forget=True)
    assert forgot == kept and b"Socket-3" in kept
    # a manifest changed by another writer meanwhile is read back as such, and appended to
    changed = CastArtifacts(tmp_path / "c", "20260101-000000")
    _manifest_steps(changed, forget=False)
    changed.forget_kept()
    path = changed.run_dir / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"].append({"kind": "by hand"})
    path.write_text(json.dumps(doc))
    changed.add_manifest_entry({"kind": "after"})
    assert [e.get("kind") for e in json.loads(path.read_text())["entries"]][-2:] == ["by hand", "after"]


def test_a_cast_waiting_for_its_agent_keeps_no_manifest_text(tmp_path):
    """While its turn is with its SocketActor (the agent has not answered yet), a cast's files
    object holds none of the manifest; the cast then completes as any other."""
    write_project_config(tmp_path, CONFIG)
    rt = make_runtime()
    try:
        agent, _ui = open_session(rt, "s1", tmp_path, {"*": [{"text": "ok", "delay_ms": 400}]})
        cast_id = materia_call(rt, "s1", "start", {"request": "r"})["cast_id"]
        handle = rt.system.registry.find(rt.session("s1").child("cast", cast_id))
        wait_for(lambda: handle.actor is not None and handle.actor._sockets, what="the turn with its SocketActor")
        arts = handle.actor.artifacts
        wait_for(lambda: arts._manifest_body is None, what="the manifest's text forgotten")
        assert not arts._made and not arts._fitted
        view = wait_status(rt, "s1", cast_id)
        assert view["status"] == "complete"
        manifest = json.loads((Path(view["run_dir"]) / "manifest.json").read_text())
        assert [e.get("kind") for e in manifest["entries"]].count("socket_output") == 1
    finally:
        rt.shutdown(30)


def test_a_started_cast_does_not_keep_the_view_its_starter_read(tmp_path):
    """The status view a new cast's first incarnation leaves for its starter (instead of an ask) is
    taken once by the starter and dropped: a live cast does not hold it (~4 KB) for its life."""
    write_project_config(tmp_path, CONFIG)
    rt = make_runtime()
    try:
        open_session(rt, "s1", tmp_path, {"*": [{"text": "ok", "delay_ms": 3000}]})
        started = materia_call(rt, "s1", "start", {"request": "r"})
        assert started["cast_id"] and started["run_dir"]  # the starter's answer still has the view
        handles = list(rt.system.registry.children(rt.session("s1").child("cast")))
        assert len(handles) == 1 and handles[0].alive
        env = handles[0].actor.env
        assert env.cast_id == started["cast_id"]
        assert env.started_view is None
    finally:
        rt.shutdown(30)
