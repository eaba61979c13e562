"""The Icarus backend's storage on a real full disk: its fabric directory on a small tmpfs
(mounted by the test; root only, skipped otherwise), driven over a real endpoint. A write the disk
refuses answers ``storage_unavailable`` (``data.errno: ENOSPC``), never ``internal``; what was
written before stays readable; the same worker writes again once space is freed."""

from __future__ import annotations

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
