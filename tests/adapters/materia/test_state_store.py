"""castor.adapters.materia.state_store: atomic saves, fencing, listing, kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from castor.adapters.materia.state_store import CastStateStore, StateCorrupt, list_casts
from castor.messages.errors import Conflict, Forbidden, NotFound

CAST = "2026-05-12T19-40-40-605Z"


def test_save_and_load_roundtrip_with_revisions(tmp_path):
    store = CastStateStore(tmp_path)
    inc = store.claim(CAST)
    assert inc == 1
    first = store.save(CAST, {"version": 2, "active": True}, incarnation=inc)
    second = store.save(CAST, {"version": 2, "active": False}, incarnation=inc)
    assert (first.revision, second.revision) == (1, 2)
    loaded = store.load(CAST)
    assert loaded.state == {"version": 2, "active": False} and loaded.revision == 2 and loaded.incarnation == 1
    raw = json.loads((tmp_path / CAST / "state.json").read_text())
    assert raw["castId"] == CAST and raw["format"] == 1


def test_zombie_incarnation_is_refused_and_leaves_state_untouched(tmp_path):
    store = CastStateStore(tmp_path)
    old = store.claim(CAST)
    store.save(CAST, {"owner": "old"}, incarnation=old)
    new = store.claim(CAST)
    assert new == old + 1
    with pytest.raises(Conflict) as info:
        store.save(CAST, {"owner": "zombie"}, incarnation=old)
    assert info.value.data["reason"] == "stale_incarnation"
    assert store.load(CAST).state == {"owner": "old"}  # claim keeps the state
    store.save(CAST, {"owner": "new"}, incarnation=new)
    assert store.load(CAST).state == {"owner": "new"}


def test_a_fresh_claim_writes_nothing_and_a_restart_still_fences_an_incarnation_that_never_saved(tmp_path):
    store = CastStateStore(tmp_path)
    first, stored = store.claim_loaded(CAST, at_least=1, fresh=True)
    assert (first, stored.revision, stored.state) == (1, 0, {})
    assert not (tmp_path / CAST / "state.json").exists()  # the first save will create it
    restart, _ = store.claim_loaded(CAST, at_least=2)  # the actor's 2nd incarnation: nothing saved yet
    assert restart == 2 and store.load(CAST).incarnation == 2
    with pytest.raises(Conflict) as info:  # the abandoned first incarnation's late first save
        store.save(CAST, {"owner": "zombie"}, incarnation=first)
    assert info.value.data["reason"] == "stale_incarnation"
    store.save(CAST, {"owner": "restart"}, incarnation=restart)
    again, stored = store.claim_loaded(CAST, at_least=1, fresh=True)  # a stored document: claimed as usual
    assert again == 3 and stored.state == {"owner": "restart"} and store.load(CAST).incarnation == 3


def test_a_save_knows_its_own_last_document_but_any_other_writer_is_seen(tmp_path):
    """Saves skip the header read only while the file is the one this store wrote last."""
    root = tmp_path / "root"
    mine, other = CastStateStore(root), CastStateStore(root)
    old = mine.claim(CAST)
    for n in range(3):  # the signature path: revisions still count up from the stored ones
        assert mine.save_encoded(CAST, json.dumps({"n": n}), incarnation=old)[:2] == (n + 1, old)
    new = other.claim(CAST)  # another actor (or process) takes over through its own store
    with pytest.raises(Conflict) as info:
        mine.save_encoded(CAST, json.dumps({"owner": "zombie"}), incarnation=old)
    assert info.value.data == {"reason": "stale_incarnation", "stored": new, "given": old}
    assert other.save_encoded(CAST, json.dumps({"owner": "new"}), incarnation=new)[:2] == (4, new)
    # A symlink planted in place of the document this store wrote last is refused, not followed.
    path = root / CAST / "state.json"
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(Forbidden):
        other.save_encoded(CAST, json.dumps({"owner": "new"}), incarnation=new)
    assert outside.read_text() == "{}"


def test_expected_revision_gives_compare_and_swap(tmp_path):
    store = CastStateStore(tmp_path)
    inc = store.claim(CAST)
    saved = store.save(CAST, {"n": 1}, incarnation=inc, expected_revision=0)
    with pytest.raises(Conflict) as info:
        store.save(CAST, {"n": 2}, incarnation=inc, expected_revision=saved.revision - 1)
    assert info.value.data["reason"] == "revision_mismatch"
    assert store.load(CAST).state == {"n": 1}


def test_concurrent_claims_get_distinct_incarnations(tmp_path):
    store = CastStateStore(tmp_path)
    barrier = threading.Barrier(8)
    got: list[int] = []
    lock = threading.Lock()

    def claim() -> None:
        barrier.wait()
        inc = CastStateStore(tmp_path).claim(CAST)
        with lock:
            got.append(inc)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(got) == list(range(1, 9))
    assert store.load(CAST).incarnation == 8


def test_unknown_and_hostile_ids(tmp_path):
    store = CastStateStore(tmp_path)
    with pytest.raises(NotFound):
        store.load(CAST)
    for bad in ("../x", "/etc", "a/b", "a\x00b", "y" * 300):
        with pytest.raises(Forbidden):
            store.save(bad, {}, incarnation=1)
    assert list(tmp_path.iterdir()) == []


def _state(cast_id: str, **fields):
    return {"version": 2, "castId": cast_id, **fields}


def test_list_casts_summaries_and_problems(tmp_path):
    store = CastStateStore(tmp_path)
    rows = {
        "c-active": _state("c-active", active=True, phase="Socket-2", currentSocketId="Socket-2",
                           socketState="awaiting_agent_response", updatedAt="2026-01-01T00:00:05Z"),
        "c-done": _state("c-done", active=False, phase="complete", socketState="complete",
                         currentSocketId="Socket-3", updatedAt="2026-01-01T00:00:04Z"),
        "c-failed": _state("c-failed", active=False, phase="failed", socketState="failed",
                           currentSocketId="Socket-1", failedReason="boom", updatedAt="2026-01-01T00:00:03Z"),
        "c-aborted": _state("c-aborted", active=False, phase="Socket-1", socketState="failed",
                            currentSocketId="Socket-1", failedReason="aborted by user",
                            updatedAt="2026-01-01T00:00:02Z"),
        "c-paused": _state("c-paused", active=True, socketState="awaiting_user_refinement",
                           currentSocketId="Socket-1", updatedAt="2026-01-01T00:00:01Z"),
    }
    for cast_id, state in rows.items():
        store.save(cast_id, state, incarnation=store.claim(cast_id))
    (tmp_path / "c-corrupt").mkdir()
    (tmp_path / "c-corrupt" / "state.json").write_text("{not json")
    (tmp_path / "c-nostate").mkdir()
    (tmp_path / "c-wrongshape").mkdir()
    (tmp_path / "c-wrongshape" / "state.json").write_text("[1, 2]")
    (tmp_path / "not a cast id").mkdir()
    (tmp_path / "stray-file").write_text("x")

    listing = list_casts(tmp_path)
    summary = {(c.cast_id, c.status, c.current_socket, c.resumable) for c in listing.casts}
    assert summary == {
        ("c-active", "active", "Socket-2", False),
        ("c-done", "complete", "Socket-3", False),
        ("c-failed", "failed", "Socket-1", True),
        ("c-aborted", "aborted", "Socket-1", True),
        ("c-paused", "awaiting_refinement", "Socket-1", False),
    }
    assert [c.cast_id for c in listing.casts] == ["c-active", "c-done", "c-failed", "c-aborted", "c-paused"]
    assert {p.cast_id for p in listing.problems} == {"c-corrupt", "c-nostate", "c-wrongshape"}
    assert list_casts(tmp_path / "missing").casts == []


_WRITER = r"""
import sys
from castor.adapters.materia.state_store import CastStateStore
store = CastStateStore(sys.argv[1])
inc = store.claim("victim")
blob = "x" * 400_000
n = 0
while True:
    n += 1
    store.save("victim", {"n": n, "blob": blob + str(n)}, incarnation=inc)
    sys.stdout.write(f"{n}\n")
    sys.stdout.flush()
"""


@pytest.mark.timeout(60)
def test_state_file_always_parses_after_kill_9_mid_write(tmp_path):
    store = CastStateStore(tmp_path)
    last_seen = 0
    for round_no, kill_after in enumerate((1, 3, 7, 2, 5)):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        seen = 0
        while seen < kill_after and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "writer died early"
            seen = int(line)
        assert seen >= kill_after, "the writer did not reach its kill point in time"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        stored = store.load("victim")  # must parse every time
        assert stored.state["n"] >= seen
        assert stored.state["blob"] == "x" * 400_000 + str(stored.state["n"])
        assert stored.incarnation == round_no + 1
        last_seen = stored.state["n"]
    assert last_seen >= 1
    assert list_casts(tmp_path).casts[0].cast_id == "victim"


def test_claim_removes_debris_of_a_writer_killed_mid_write(tmp_path):
    store = CastStateStore(tmp_path)
    store.save(CAST, {"n": 1}, incarnation=store.claim(CAST))
    debris = tmp_path / CAST / ".state.json.999.dead.tmp"
    debris.write_text('{"half": ')
    assert store.claim(CAST) == 2
    assert not debris.exists()
    assert store.load(CAST).state == {"n": 1}


def test_fence_is_read_from_the_header_and_any_other_layout_still_fences(tmp_path):
    store = CastStateStore(tmp_path)
    inc = store.claim(CAST)
    revision, incarnation, _ = store.save_encoded(CAST, json.dumps({"active": True}), incarnation=inc)
    assert (revision, incarnation) == (1, 1)
    path = tmp_path / CAST / "state.json"
    assert path.read_bytes().startswith(b'{"format":1,"castId":"' + CAST.encode() + b'","revision":1,"incarnation":1,')
    # A document in another layout (keys reordered, pretty) written by a newer owner: still fenced.
    path.write_text(json.dumps({"state": {"active": False}, "incarnation": 7, "revision": 9, "savedAt": "t",
                                "castId": CAST, "format": 1}, indent=2))
    with pytest.raises(Conflict) as stale:
        store.save_encoded(CAST, json.dumps({"active": True}), incarnation=inc)
    assert stale.value.data == {"reason": "stale_incarnation", "stored": 7, "given": 1}
    assert store.save_encoded(CAST, json.dumps({"n": 1}), incarnation=7)[:2] == (10, 7)
    assert store.load(CAST).state == {"n": 1}
    path.write_text('{"format":1, "castId": "' + CAST + '", "revision": 3, "incarnation"')  # torn
    with pytest.raises(StateCorrupt):
        store.save_encoded(CAST, "{}", incarnation=7)


@pytest.mark.timeout(30)
def test_a_fresh_claim_of_an_allocated_run_directory_looks_at_it_and_its_state_file_once_each(
        tmp_path, monkeypatch):
    """A start's claim (fresh) of the run directory its allocation just made: one ``lstat`` of the
    directory and one of its state file -- what the containment walk looks at -- and no second look
    (``isdir``, ``lexists``, the cast's files walking to the same directory); its first save then
    writes there. A state file already there (a
    writer got in first) is claimed as any stored document is."""
    from castor.adapters.materia import state_store

    (tmp_path / CAST).mkdir(mode=0o700)
    store = CastStateStore(tmp_path)
    looked: list[str] = []
    real_lstat = os.lstat
    monkeypatch.setattr(state_store.os, "lstat", lambda path, *a, **k: (looked.append(str(path)),
                                                                           real_lstat(path, *a, **k))[1])
    monkeypatch.setattr(state_store.os.path, "isdir", lambda path: pytest.fail(f"isdir({path})"))
    monkeypatch.setattr(state_store.os.path, "lexists", lambda path: pytest.fail(f"lexists({path})"))
    first, stored = store.claim_loaded(CAST, at_least=1, fresh=True)
    assert (first, stored.revision, stored.state) == (1, 0, {})
    assert looked == [f"{tmp_path}/{CAST}", f"{tmp_path}/{CAST}/state.json"]
    files = store.artifacts(CAST)  # the cast's files, asked right after its claim: no walk again
    assert looked == [f"{tmp_path}/{CAST}", f"{tmp_path}/{CAST}/state.json"]
    assert str(files.run_dir) == f"{tmp_path}/{CAST}"
    monkeypatch.undo()
    assert store.save(CAST, {"owner": "first"}, incarnation=first).revision == 1
    assert store.load(CAST).state == {"owner": "first"}
    other = CastStateStore(tmp_path)  # another store's fresh claim meets the saved state: a usual claim
    again, stored = other.claim_loaded(CAST, at_least=1, fresh=True)
    assert again == 2 and stored.state == {"owner": "first"} and other.load(CAST).incarnation == 2
