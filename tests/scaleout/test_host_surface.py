"""A Ray cast host's session names the commands of the surface the user is on.

A session the serving process places on a cast host (``castor serve --backend ray``) is opened
there behind relay ports, ``kind`` "ray-relay": its session actor took that for the CLI, so
every answer a harness got through the endpoint -- ``/materia abort``'s "Recast it with ...",
``/materia status``'s ``↻ RECAST TARGET``, the casts listing -- named ``castor recast ID``, which
a cast a harness ran cannot take as typed (no agent is remembered for it). The host now opens
the session with the kind of the harness it relays: ``/materia recast ID`` in a harness session,
``castor recast ID`` for a castor command's cast. The host's body runs here without Ray (the
relay ports only queue what they would send).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from castor.scaleout.host import CastHost

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("harness_kind", "recast"), [("endpoint", "/materia recast"), ("standalone", "castor recast")])
def test_a_cast_host_s_answers_name_the_recast_of_the_surface_the_user_is_on(tmp_path: Path, harness_kind, recast):
    host = CastHost("h1", {})
    stop = threading.Event()

    def serving_process() -> None:  # answers what the host asks the harness (its session entries)
        while not stop.is_set():
            for item in host.drain(timeout_s=0.1):
                if item.get("request_id") is not None:
                    host.answer(item["request_id"], True, {"ok": True, "entry_id": "e"})

    relay = threading.Thread(target=serving_process, daemon=True)
    relay.start()
    try:
        sid = "s1"
        opened = host.open_session({"session_id": sid, "cwd": str(tmp_path), "trusted": True}, False, None,
                                   "Pi agent", harness_kind)
        assert opened == {"session_id": sid}, opened
        started = host.call(sid, "start", {"request": "x"}, 20)["ok"]
        cast_id = started["cast_id"]
        aborted = host.call(sid, "abort", {}, 20)["ok"]["text"]
        assert aborted == f"pi-materia cast {cast_id} aborted. Recast it with {recast} {cast_id}.", aborted
        again = host.call(sid, "abort", {"cast_id": cast_id}, 20)["ok"]["text"]
        assert again == f"pi-materia cast {cast_id} is already aborted. Recast it with {recast} {cast_id}.", again
        status = host.call(sid, "status", {"cast_id": cast_id}, 20)["ok"]["text"]
        assert f"↻ RECAST TARGET: {recast} {cast_id}" in status, status
        listed = host.call(sid, "list", {}, 20)["ok"]["text"]
        assert f"recast: {recast} {cast_id}" in listed, listed
        other = "castor recast" if recast.startswith("/materia") else "/materia recast"
        assert other not in aborted + again + status + listed
    finally:
        stop.set()
        relay.join(5)
        host.shutdown()
