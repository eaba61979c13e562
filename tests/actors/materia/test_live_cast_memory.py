"""What a live cast keeps in memory: what several casts can share is shared, not copied per cast."""

from __future__ import annotations

import pytest

from castor.actors.materia.api import materia_call
from tests.actors.materia.helpers import make_runtime, open_session, wait_status, write_project_config

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
