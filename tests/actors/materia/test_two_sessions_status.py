"""Two harness sessions (two Pi instances) in one project: an id-less status shows the asking
session's own cast, not the newest cast the other session runs; with none of its own it says
that the cast it shows runs elsewhere (abort and continue there)."""

from __future__ import annotations

import pytest

from .helpers import wait_for, write_project_config
from .test_endpoint import FakeHarness

ONE = {"activeLoadout": "One", "materia": {"S": {"prompt": "Step {{request}}", "tools": "none"}},
       "loadouts": {"One": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "S"}}}}}


class SilentHarness(FakeHarness):
    """Takes castor's turns and never answers them: its casts keep running."""

    def _run_turn(self, params: dict) -> None:
        self.turns.append(params)


def _two_sessions(served, project):
    """Two Pi sessions on one project: ``pi-a`` never answers its turns, ``pi-b`` answers "done"."""
    write_project_config(project, ONE)
    a, b = served(), served()
    SilentHarness(a, "pi-a", {})
    FakeHarness(b, "pi-b", {"*": ["done"]})
    for client, sid in ((a, "pi-a"), (b, "pi-b")):
        client.call("session.open", {"session_id": sid, "cwd": str(project), "trusted": True})
    return a, b


@pytest.mark.timeout(60)
def test_an_id_less_status_shows_this_sessions_cast_not_the_other_sessions_newer_one(served, project):
    a, b = _two_sessions(served, project)

    first = a.call("cast.start", {"session_id": "pi-a", "cwd": str(project), "request": "a's first"})["cast_id"]
    shown = b.call("cast.status", {"session_id": "pi-b", "cwd": str(project)})
    assert shown["cast_id"] == first and shown.get("elsewhere") is True
    assert "runs in another session" in shown["text"]

    own = b.call("cast.start", {"session_id": "pi-b", "cwd": str(project), "request": "b's own"})["cast_id"]
    wait_for(lambda: b.call("cast.status", {"session_id": "pi-b", "cast_id": own})["status"] == "complete",
             what="b's cast to complete")
    a.call("cast.abort", {"session_id": "pi-a", "cwd": str(project)})
    newer = a.call("cast.start", {"session_id": "pi-a", "cwd": str(project), "request": "a's second"})["cast_id"]
    assert newer > own
    shown = b.call("cast.status", {"session_id": "pi-b", "cwd": str(project)})
    assert shown["cast_id"] == own and "elsewhere" not in shown, "b's own cast, not a's newer running one"
    assert a.call("cast.status", {"session_id": "pi-a", "cwd": str(project)})["cast_id"] == newer


@pytest.mark.timeout(60)
def test_a_status_by_id_of_the_other_sessions_running_cast_says_it_runs_there(served, project):
    """``/materia status ID`` naming the cast the other Pi runs: the view says whose it is, as the
    verbs on that id do (``conflict``, ``held_elsewhere``) -- it used to read as this session's
    active cast, which ``/materia abort ID`` then refused."""
    a, b = _two_sessions(served, project)
    theirs = a.call("cast.start", {"session_id": "pi-a", "cwd": str(project), "request": "a's"})["cast_id"]
    shown = b.call("cast.status", {"session_id": "pi-b", "cast_id": theirs})
    assert shown["cast_id"] == theirs and shown["status"] == "active" and shown.get("elsewhere") is True
    assert "runs in another session" in shown["text"]
    assert "elsewhere" not in a.call("cast.status", {"session_id": "pi-a", "cast_id": theirs})  # its own
    a.call("cast.abort", {"session_id": "pi-a", "cast_id": theirs})
    shown = b.call("cast.status", {"session_id": "pi-b", "cast_id": theirs})
    assert shown["status"] == "aborted" and "elsewhere" not in shown  # ended: nobody's any more
