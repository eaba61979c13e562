"""The Icarus backend's storage on a real full disk: its fabric directory on a small tmpfs
(mounted by the test; root only, skipped otherwise), driven over a real endpoint. A write the disk
refuses answers ``storage_unavailable`` (``data.errno: ENOSPC``), never ``internal``; what was
written before stays readable; the same worker writes again once space is freed."""

from __future__ import annotations

import json
import sqlite3

import pytest

from castor.messages.errors import CastorError
from tests.actors.icarus.test_session_endpoint import open_session
from tests.actors.icarus.test_session_endpoint import wired as wired  # noqa: F401 - the endpoint fixture, shared
from tests.support.tmpfs import fill_to_the_last_block, mounted_tmpfs

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def full_fabric(wired):  # noqa: F811 - the shared fixture above
    world, connect = wired
    with mounted_tmpfs(world.fabric, "256k"):
        try:
            yield world, connect
        finally:
            world.close()  # the worker holds the database open: stop it before the mount goes


def _fill(directory) -> None:
    fill_to_the_last_block(directory, 65536)


def test_a_fabric_write_on_a_full_disk_is_storage_unavailable_and_nothing_written_is_lost(full_fabric):
    world, connect = full_fabric
    client, _harness = connect()
    open_session(client, world, "pi-1")

    def tool(name: str, **params) -> dict:
        return client.call("icarus.tool", {"session_id": "pi-1", "name": name, "params": params,
                                           "tool_call_id": "t1"}, timeout=30)

    kept = tool("fabric_write", type="note", summary="kept", content="written while there was room")
    assert kept["status"] == "written"
    _fill(world.fabric)
    with pytest.raises(CastorError) as refused:
        tool("fabric_write", type="note", summary="lost", content="x" * 50_000)
    assert refused.value.code == "storage_unavailable", refused.value.to_wire()
    assert refused.value.data["errno"] == "ENOSPC" and refused.value.data["reason"] == "backend_error"
    recalled = tool("fabric_recall", query="kept")
    assert [e["summary"] for e in recalled["entries"]] == ["kept"], recalled
    (world.fabric / "filler.bin").unlink()
    assert tool("fabric_write", type="note", summary="after", content="room again")["status"] == "written"


SECRET = "SECRET-MEMORY-TEXT"


def _settle(client, answer: str) -> None:
    """One user turn the harness settles: a capture (``post_llm_call``) of ``answer``."""
    event = lambda name, **data: client.call("harness.event", {"session_id": "pi-1", "event": name,  # noqa: E731 - a short local helper
                                                                "data": data}, timeout=30)
    event("before_agent_start", prompt=f"ask {SECRET}", message_type="user")
    event("agent_end", messages=[{"role": "user", "text": f"ask {SECRET}", "stop_reason": None},
                                 {"role": "assistant", "text": answer, "stop_reason": "stop"}])
    assert event("agent_settled", aborted=False) == {}


def test_a_capture_lost_to_a_full_disk_is_told_to_the_harness_once_typed_and_the_next_one_works(wired):  # noqa: F811
    """The session's turn capture refused by a full disk: the harness gets one ``ui.notify`` warning
    with the code ``storage_unavailable`` (no memory text in it, nor in castor's log), a second lost
    capture of the same outage adds none, the session goes on (its prompts still retrieve what was
    kept), and once space is freed the next capture is stored."""
    from loguru import logger

    world, connect = wired
    records: list[str] = []
    sink = logger.add(lambda m: records.append(f"{m.record['message']} {m.record['extra']}"), level="DEBUG")
    with mounted_tmpfs(world.fabric, "600k"):
        try:
            client, harness = connect()
            open_session(client, world, "pi-1")
            client.call("harness.event", {"session_id": "pi-1", "event": "session_start", "data": {}}, timeout=30)
            _settle(client, "kept answer")
            assert len(world.calls("hooks.post_llm_call")) == 1
            fill_to_the_last_block(world.fabric, 4096)
            _settle(client, SECRET * 20_000)
            _settle(client, SECRET * 20_000)
            assert len(world.calls("hooks.post_llm_call")) == 3  # both ran, both refused
            with harness.noted:
                assert harness.noted.wait_for(lambda: any(m == "ui.notify" for m, _ in harness.notes), 10)
            client.call("icarus.config", {"session_id": "pi-1"})  # a round trip: a second notice would be in
            notices = [p for m, p in harness.notes if m == "ui.notify"]
            assert len(notices) == 1, notices
            [notice] = notices
            assert notice["level"] == "warning" and notice["code"] == "storage_unavailable", notice
            assert SECRET not in notice["message"] and "ENOSPC" in notice["message"], notice
            (world.fabric / "filler.bin").unlink()
            _settle(client, "after the space came back")
            stored = client.call("icarus.tool", {"session_id": "pi-1", "name": "fabric_search",
                                                 "params": {"query": "x"}, "tool_call_id": "t"}, timeout=30)
            assert stored is not None  # the session's worker still serves its tools
            db = world.fabric / "icarus_reference.sqlite3"

            rows = [r[0] for r in sqlite3.connect(db).execute("SELECT assistant_response FROM exchanges")]
            assert rows == ["kept answer", "after the space came back"], [r[:40] for r in rows]
        finally:
            logger.remove(sink)
            world.close()
    assert not [r for r in records if SECRET in r]


def test_a_database_file_that_is_a_directory_in_fabric_dir_is_storage_unavailable_naming_the_setting(wired):  # noqa: F811
    """The backend's database file inside ``fabricDir`` is a directory (SQLite's "unable to open
    database file", no errno, no path): it was ``internal`` (``backend_error``), as if castor had
    failed. Over a real endpoint: ``storage_unavailable`` naming the setting (``fabricDir``), its
    path and the entry in the way, in castor's words (never the memory's text); the worker is kept,
    and once the directory is gone the same worker writes."""
    world, connect = wired
    client, _harness = connect()
    open_session(client, world, "pi-1")
    world.fabric.mkdir(parents=True, exist_ok=True)
    (world.fabric / "icarus_reference.sqlite3").mkdir()

    def tool(name: str, **params) -> dict:
        return client.call("icarus.tool", {"session_id": "pi-1", "name": name, "params": params,
                                           "tool_call_id": "t1"}, timeout=30)

    with pytest.raises(CastorError) as refused:
        tool("fabric_write", type="note", summary="lost", content=f"{SECRET} in a note")
    error = refused.value
    assert error.code == "storage_unavailable", error.to_wire()
    assert error.data["setting"] == "fabricDir" and error.data["path"] == str(world.fabric), error.data
    assert error.data["errno"] == "EISDIR", error.data
    assert "fabricDir" in error.message and "icarus_reference.sqlite3" in error.message, error.message
    assert SECRET not in json.dumps(error.to_wire()), error.to_wire()
    (world.fabric / "icarus_reference.sqlite3").rmdir()
    assert tool("fabric_write", type="note", summary="after", content="a file now")["status"] == "written"



def _refused_write(world, connect) -> CastorError:
    """A ``fabric_write`` over the endpoint, which the test expects refused: the error it got."""
    client, _harness = connect()
    open_session(client, world, "pi-1")
    with pytest.raises(CastorError) as refused:
        client.call("icarus.tool", {"session_id": "pi-1", "name": "fabric_write", "tool_call_id": "t1",
                                    "params": {"type": "note", "summary": "lost", "content": f"{SECRET} in a note"}},
                    timeout=30)
    return refused.value


def test_a_database_file_without_a_database_ending_made_a_directory_in_fabric_dir_is_storage_unavailable(
        wired, tmp_path):  # noqa: F811
    """A backend whose database file in ``fabricDir`` is named with no database ending
    (``icarus_state``), made a directory: ``storage_unavailable`` naming ``fabricDir``, its path,
    the entry in the way and ``EISDIR`` -- it was ``internal``, only names like ``*.sqlite3`` were
    looked for. The worker is kept: once the directory is gone the same worker writes."""
    import shutil

    from tests.support.icarus import REFERENCE_ICARUS

    world, connect = wired
    backend = tmp_path / "backend" / "icarus"
    shutil.copytree(REFERENCE_ICARUS, backend)
    state_py = backend / "state.py"
    state_py.write_text(state_py.read_text().replace('"icarus_reference.sqlite3"', '"icarus_state"'))
    world.write_global(icarusDir=str(backend))
    world.fabric.mkdir(parents=True, exist_ok=True)
    (world.fabric / "notes").mkdir()  # a directory of the backend's own: never named
    (world.fabric / "icarus_state").mkdir()
    error = _refused_write(world, connect)
    assert error.code == "storage_unavailable", error.to_wire()
    assert (error.data["setting"], error.data["path"], error.data["errno"]) == ("fabricDir", str(world.fabric),
                                                                               "EISDIR"), error.data
    assert "icarus_state" in error.message and "notes" not in error.message, error.message
    (world.fabric / "icarus_state").rmdir()
    client, _harness = connect()
    open_session(client, world, "pi-2")
    written = client.call("icarus.tool", {"session_id": "pi-2", "name": "fabric_write", "tool_call_id": "t2",
                                          "params": {"type": "note", "summary": "after", "content": "a file now"}},
                          timeout=30)
    assert written["status"] == "written"
