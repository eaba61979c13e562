"""The cast index: paged listings that never read every state.json, and never stay wrong.

state.json is the truth: every test here changes it (or the directories) behind the index's
back — by hand, from another process, by a kill -9 mid-update, by corrupting the index — and
checks the listing says what the files say.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from castor.adapters.materia import cast_index, state_store
from castor.adapters.materia.artifacts import allocate_cast_id
from castor.adapters.materia.cast_index import DB_NAME
from castor.adapters.materia.state_store import CastStateStore, list_page, newest
from castor.messages.errors import InvalidParams


def _state(status: str, **extra):
    """A CastState-like object with the fields a listing row is made of."""
    fields = {"active": status == "active", "phase": status if status in ("complete", "failed") else "Socket-1",
              "socket_state": {"complete": "complete", "failed": "failed"}.get(status, "awaiting_agent_response"),
              "failed_reason": "boom" if status == "failed" else None, "aborted": False,
              "current_socket_id": "Socket-1", "updated_at": time.time(), "request": "r",
              "recovery_exhaustion": None}
    fields.update(extra)
    return SimpleNamespace(**fields)


def _doc(state) -> dict:
    return {"active": state.active, "phase": state.phase, "socket_state": state.socket_state,
            "failed_reason": state.failed_reason, "current_socket_id": state.current_socket_id,
            "updated_at": state.updated_at, "request": state.request}


def _save(store: CastStateStore, cast_id: str, status: str) -> None:
    state = _state(status)
    store.save_encoded(cast_id, json.dumps(_doc(state)), incarnation=1, index=state)


def _write_raw(root: Path, cast_id: str, state: dict) -> None:
    """A minimal valid state document written by hand (no store, no index)."""
    (root / cast_id).mkdir(exist_ok=True)
    doc = {"format": 1, "castId": cast_id, "revision": 1, "incarnation": 1, "savedAt": "2026-01-01T00:00:00.000Z",
           "state": state}
    (root / cast_id / "state.json").write_text(json.dumps(doc))


def _all(root: Path, limit: int = 50) -> list[tuple[str, str]]:
    out, cursor = [], None
    while True:
        page = list_page(root, limit=limit, cursor=cursor)
        out += [(c.cast_id, c.status) for c in page.casts] + [(p.cast_id, "unreadable") for p in page.problems]
        cursor = page.next_cursor
        if cursor is None:
            return out


def _truth(root: Path) -> dict[str, str]:
    store = CastStateStore(root)
    out = {}
    for entry in root.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        out[entry.name] = state_store._read_row(store, entry.name, "").status
    return out


def test_pages_cover_every_cast_once_newest_first_problems_last(tmp_path):
    store = CastStateStore(tmp_path)
    ids = [allocate_cast_id(tmp_path) for _ in range(120)]
    for n, cast_id in enumerate(ids):
        _save(store, cast_id, ("complete", "failed", "active")[n % 3])
    (tmp_path / "zz-no-state").mkdir()
    listed = _all(tmp_path, limit=50)
    assert [c for c, _ in listed] == sorted(ids, reverse=True) + ["zz-no-state"]
    assert dict(listed) == _truth(tmp_path)
    page = list_page(tmp_path, limit=50)
    assert len(page.casts) == 50 and page.total == 121 and page.next_cursor is not None
    last = list_page(tmp_path, limit=50, cursor=list_page(tmp_path, limit=50, cursor=page.next_cursor).next_cursor)
    assert len(last.casts) == 20 and [p.cast_id for p in last.problems] == ["zz-no-state"]
    assert last.next_cursor is None
    for bad in ("nonsense", "2:x", "0:../etc"):
        with pytest.raises(InvalidParams):
            list_page(tmp_path, cursor=bad)
    with pytest.raises(InvalidParams):
        list_page(tmp_path, limit=0)


def test_a_page_reads_only_its_own_state_files(tmp_path, monkeypatch):
    store = CastStateStore(tmp_path)
    for _ in range(300):
        _save(store, allocate_cast_id(tmp_path), "complete")
    list_page(tmp_path)  # index current
    reads = []
    real = state_store._read_row
    monkeypatch.setattr(state_store, "_read_row", lambda *a: reads.append(a[1]) or real(*a))
    page = list_page(tmp_path, limit=10)
    assert len(page.casts) == 10 and reads == []  # finished casts: one lstat each, no read
    assert next(newest(tmp_path, "readable")).cast_id == page.casts[0].cast_id and reads == []


def test_changes_behind_the_index_are_seen(tmp_path):
    store = CastStateStore(tmp_path)
    a, b = allocate_cast_id(tmp_path), allocate_cast_id(tmp_path)
    _save(store, a, "complete")
    _save(store, b, "failed")
    assert dict(_all(tmp_path)) == {a: "complete", b: "failed"}
    # another writer (no index) finishes b, adds c, removes a
    _write_raw(tmp_path, b, {"active": False, "phase": "complete", "socketState": "complete"})
    _write_raw(tmp_path, "c-by-hand", {"active": False, "phase": "failed", "socketState": "failed"})
    shutil.rmtree(tmp_path / a)
    assert dict(_all(tmp_path)) == {b: "complete", "c-by-hand": "failed"} == _truth(tmp_path)
    # an id-less search sees the hand-made failed cast as a recast candidate
    assert [s.cast_id for s in newest(tmp_path, "candidate")] == ["c-by-hand"]



@pytest.mark.parametrize("limit", [50, 1])
def test_a_cast_that_turns_unreadable_or_is_repaired_is_listed_once_in_its_place(tmp_path, limit):
    """A state.json damaged behind the index moves the cast from the casts to the unreadable
    directories: listed there once (it was listed twice, found first among the casts and then
    again where the corrected index put it). Repaired, it is back among the casts, newest first
    (it came after the older casts, from the unreadable section where the index still had it)."""
    store = CastStateStore(tmp_path)
    older, newer = allocate_cast_id(tmp_path), allocate_cast_id(tmp_path)
    _save(store, older, "complete")
    _save(store, newer, "failed")
    assert _all(tmp_path, limit) == [(newer, "failed"), (older, "complete")]
    good = (tmp_path / newer / "state.json").read_text()
    (tmp_path / newer / "state.json").write_text("{")
    assert _all(tmp_path, limit) == [(older, "complete"), (newer, "unreadable")]
    assert list_page(tmp_path).total == 2
    (tmp_path / newer / "state.json").write_text(good)
    assert _all(tmp_path, limit) == [(newer, "failed"), (older, "complete")]


def test_a_corrupt_or_deleted_index_is_rebuilt(tmp_path):
    store = CastStateStore(tmp_path)
    ids = [allocate_cast_id(tmp_path) for _ in range(5)]
    for cast_id in ids:
        _save(store, cast_id, "complete")
    truth = _truth(tmp_path)
    cast_index.forget(str(tmp_path.resolve()))
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    assert dict(_all(tmp_path)) == truth
    assert sqlite3.connect(tmp_path / DB_NAME).execute("SELECT COUNT(*) FROM casts").fetchone()[0] == 5
    os.unlink(tmp_path / DB_NAME)
    assert dict(_all(tmp_path)) == truth
    assert (tmp_path / DB_NAME).is_file()


def test_an_unusable_index_falls_back_to_reading_every_state(tmp_path, monkeypatch):
    store = CastStateStore(tmp_path)
    ids = [allocate_cast_id(tmp_path) for _ in range(3)]
    for cast_id in ids:
        _save(store, cast_id, "failed")
    cast_index.forget(str(tmp_path.resolve()))

    def refuse(*_a, **_k):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(cast_index.sqlite3, "connect", refuse)
    _save(store, ids[0], "complete")  # a save never fails because of the index
    assert dict(_all(tmp_path, limit=2)) == {ids[0]: "complete", ids[1]: "failed", ids[2]: "failed"}


_WRITER = r"""
import json, sys, time
from types import SimpleNamespace
from castor.adapters.materia.artifacts import allocate_cast_id
from castor.adapters.materia.state_store import CastStateStore
root, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = CastStateStore(root)
def state(status):
    return SimpleNamespace(active=False, phase=status, socket_state=status,
                           failed_reason="x" if status == "failed" else None,
                           aborted=False, current_socket_id="S", updated_at=time.time(), request="r",
                           recovery_exhaustion=None)
def save(cid, status, inc):
    s = state(status)
    store.save_encoded(cid, json.dumps({"active": False, "phase": status, "socket_state": status,
                                        "failed_reason": s.failed_reason}), incarnation=inc, index=s)
if mode == "many":
    for i in range(n):
        save(allocate_cast_id(root), ("complete", "failed")[i % 2], 1)
    print("done", flush=True)
else:
    cid = allocate_cast_id(root)
    print(cid, flush=True)
    i = 0
    while True:
        i += 1
        save(cid, ("complete", "failed")[i % 2], 1)
        if i % 50 == 0:
            print(i, flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.timeout(120)
def test_two_processes_writing_one_project_agree_with_the_files(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), "many", "60"], env=_env(),
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    list_page(tmp_path)  # a reader racing them
    for proc in procs:
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0 and "done" in out
    listed = dict(_all(tmp_path))
    assert len(listed) == 120 and listed == _truth(tmp_path)


@pytest.mark.timeout(120)
def test_kill_9_mid_update_never_leaves_the_listing_wrong(tmp_path):
    for round_no in range(5):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), "flip", "0"], env=_env(),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # the cast id
        for _ in range(round_no + 1):
            assert proc.stdout.readline(), "writer died early"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        assert dict(_all(tmp_path)) == _truth(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_listing_100000_casts_is_fast_once_indexed(tmp_path, request):
    """The issue's bound is 100 ms; asserted here with a wide margin for a loaded CI host
    (bench/longrun.py prints the measured figure). The first listing after the directories were
    made by hand rebuilds the index (a one-off, not timed). On tmpfs when there is one: making
    100,000 directories on a shared CI disk takes longer than the test is about."""
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True) if base != tmp_path else None)
    root = base / "casts"
    root.mkdir()
    body = ('{"format":1,"castId":"%s","revision":1,"incarnation":1,"savedAt":"2026-01-01T00:00:00.000Z",'
            '"state":{"active":false,"phase":"complete","socketState":"complete","request":"r"}}')
    for n in range(100_000):
        cast_id = f"2026-01-01T00-00-00-000Z-{n:06d}"
        os.mkdir(root / cast_id)
        fd = os.open(root / cast_id / "state.json", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, (body % cast_id).encode())
        os.close(fd)
    first = list_page(root)  # rebuild
    assert first.total == 100_000 and first.casts[0].cast_id.endswith("099999")
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        page = list_page(root, limit=50)
        timings.append(time.perf_counter() - started)
    assert len(page.casts) == 50 and page.next_cursor is not None
    assert min(timings) < 0.5, timings


def test_index_files_a_checkout_ships_are_never_trusted(tmp_path):
    """A link in the index's place is removed (never written through), a FIFO never blocks, and
    a database with extra schema objects (a trigger) is rebuilt."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    store = CastStateStore(root)
    cast_id = allocate_cast_id(root)
    _save(store, cast_id, "failed")
    cast_index.forget(str(root.resolve()))
    for name in (DB_NAME, DB_NAME + "-journal"):
        os.unlink(root / name) if (root / name).exists() else None
    (root / DB_NAME).symlink_to(outside / "victim.db")
    (root / (DB_NAME + "-journal")).symlink_to(outside / "victim.journal")
    assert dict(_all(root)) == {cast_id: "failed"}
    assert list(outside.iterdir()) == [] and not (root / DB_NAME).is_symlink()

    cast_index.forget(str(root.resolve()))
    conn = sqlite3.connect(root / DB_NAME)
    conn.execute("CREATE TRIGGER evil AFTER INSERT ON casts BEGIN DELETE FROM casts; END")
    conn.commit()
    conn.close()
    assert dict(_all(root)) == {cast_id: "failed"}
    names = {r[0] for r in sqlite3.connect(root / DB_NAME).execute("SELECT name FROM sqlite_master")}
    assert "evil" not in names

    cast_index.forget(str(root.resolve()))
    os.unlink(root / DB_NAME)
    os.mkfifo(root / DB_NAME)
    assert dict(_all(root)) == {cast_id: "failed"}  # from every state.json: the FIFO is left alone


def test_a_prefix_that_also_names_an_unreadable_cast_is_ambiguous_never_a_silent_pick(tmp_path):
    from castor.actors.materia.views import resolve_cast_id
    from castor.adapters.materia.storage import FILE_CAST_STORAGE
    from castor.ports.cast_storage import StateCorrupt

    store = CastStateStore(tmp_path)
    older, newer = allocate_cast_id(tmp_path), allocate_cast_id(tmp_path)
    _save(store, older, "complete")
    _save(store, newer, "failed")
    (tmp_path / newer / "state.json").write_text("{")
    prefix = os.path.commonprefix([older, newer])
    with pytest.raises(InvalidParams) as ambiguous:
        resolve_cast_id(FILE_CAST_STORAGE, tmp_path, prefix)
    assert ambiguous.value.data["candidates"] == [newer, older]
    assert resolve_cast_id(FILE_CAST_STORAGE, tmp_path, "latest") == older  # the newest readable cast
    assert resolve_cast_id(FILE_CAST_STORAGE, tmp_path, newer) == newer
    with pytest.raises(StateCorrupt) as corrupt:  # what its reader then says: the data's fault, not castor's
        CastStateStore(tmp_path).load(newer)
    assert corrupt.value.code == "state_corrupt"


def _stored_rows(root: Path) -> dict[str, str]:
    with sqlite3.connect(root / DB_NAME) as conn:
        return dict(conn.execute("SELECT id, status FROM casts"))


@pytest.mark.timeout(60)
def test_a_start_s_row_written_later_leaves_the_listing_right_meanwhile_and_costs_no_rescan_after(tmp_path):
    """A start allocates its id with the row left for the cast's thread (written after the
    starter's answer). Before it is written a listing finds the new directory (the root's
    signature moved, so it reconciles); once written, the stored signature is the root's again:
    the next listing rescans nothing."""
    from castor.adapters.materia.artifacts import allocate_cast_id_indexed_later, index_allocated

    store = CastStateStore(tmp_path)
    old = allocate_cast_id(tmp_path)
    _save(store, old, "complete")
    assert _all(tmp_path) == [(old, "complete")]
    new = allocate_cast_id_indexed_later(tmp_path)
    assert new not in _stored_rows(tmp_path)  # not written by the allocation
    index = cast_index.open_index(str(tmp_path))
    assert index is not None and index.root_signature_stored() != cast_index.root_signature(str(tmp_path))
    index_allocated(tmp_path, new)
    assert _stored_rows(tmp_path)[new] == "active"
    assert index.root_signature_stored() == cast_index.root_signature(str(tmp_path))  # no rescan due
    assert index.count() == 2
    index_allocated(tmp_path, new)  # once only
    assert index.count() == 2
    _save(store, new, "active")
    # A listing in between (a reconcile) finds it, and the late row does not undo what it found.
    later = allocate_cast_id_indexed_later(tmp_path)
    _save(store, later, "failed")  # the cast ended at once: its save wrote its row
    assert dict(_all(tmp_path))[later] == "failed"
    index_allocated(tmp_path, later)
    assert _stored_rows(tmp_path)[later] == "failed" and index.count() == 3
    assert dict(_all(tmp_path)) == {old: "complete", new: "active", later: "failed"} == _truth(tmp_path)


@pytest.mark.timeout(60)
def test_a_failed_start_s_row_left_for_later_is_never_written(tmp_path):
    from castor.adapters.materia.artifacts import allocate_cast_id_indexed_later, index_allocated
    from castor.adapters.materia.storage import FILE_CAST_STORAGE

    cast_id = allocate_cast_id_indexed_later(tmp_path)
    assert FILE_CAST_STORAGE.discard_unsaved(tmp_path, cast_id)  # no state saved: removed
    index_allocated(tmp_path, cast_id)
    assert cast_id not in _stored_rows(tmp_path) and _all(tmp_path) == []


@pytest.mark.timeout(60)
def test_rows_left_for_casts_that_never_take_them_are_bounded_and_the_listing_stays_right(tmp_path, monkeypatch):
    """A cast whose actor dies before its first message never takes the row its allocation left
    for it: the table of such rows is bounded (by count and by age), the oldest dropped unwritten,
    and a listing still finds the dropped casts (the root's signature moved: it reconciles)."""
    from castor.adapters.materia import artifacts
    from castor.adapters.materia.artifacts import allocate_cast_id_indexed_later, index_allocated

    monkeypatch.setattr(artifacts, "_UNINDEXED", {})
    monkeypatch.setattr(artifacts, "_UNINDEXED_KEPT", 4)
    ids = [allocate_cast_id_indexed_later(tmp_path) for _ in range(7)]
    pending = artifacts._UNINDEXED
    assert len(pending) == 4
    assert sorted(pending) == sorted(f"{tmp_path}/{cast_id}" for cast_id in ids[3:])  # the newest kept
    index_allocated(tmp_path, ids[0])  # dropped: nothing written, no error
    assert ids[0] not in _stored_rows(tmp_path)
    index_allocated(tmp_path, ids[6])  # kept: written
    assert _stored_rows(tmp_path)[ids[6]] == "active" and len(pending) == 3
    for cast_id in ids:  # their states saved behind the index's back: a listing finds every one
        _write_raw(tmp_path, cast_id, {"status": "active"})
    assert dict(_all(tmp_path)) == _truth(tmp_path)
    assert set(dict(_all(tmp_path))) == set(ids)
    # by age: a row left longer than _UNINDEXED_MAX_S is dropped at the next allocation
    monkeypatch.setattr(artifacts, "_UNINDEXED_MAX_S", 0.0)
    last = allocate_cast_id_indexed_later(tmp_path)
    assert list(pending) == [f"{tmp_path}/{last}"]


@pytest.mark.timeout(60)
def test_a_cast_s_row_is_left_to_the_thread_writing_the_index_and_a_read_sees_it(tmp_path):
    """Casts ending together do not each hold a thread on the index's lock: while one thread
    writes, another's row is queued for it and that thread goes on at once; the writer commits
    it with its own, and a read made afterwards sees it (a read writes what is queued first)."""
    import threading

    index = cast_index.open_index(str(tmp_path))
    assert index is not None
    inside, release = threading.Event(), threading.Event()

    def slow(conn):
        inside.set()
        assert release.wait(30)

    writer = threading.Thread(target=lambda: index._write(slow, soon=True))
    writer.start()
    assert inside.wait(30)
    left = threading.Thread(target=lambda: index.upsert([cast_index.IndexRow(cast_id="c1", status="complete")],
                                                        soon=True))
    left.start()
    left.join(5)
    assert not left.is_alive(), "the row's thread waited for the index's writer"
    release.set()
    writer.join(30)
    assert index.ids() == {"c1"}
    assert index.count() == 1


@pytest.mark.timeout(60)
def test_a_row_written_later_goes_to_an_index_file_made_again_if_it_was_deleted_meanwhile(tmp_path):
    """The start's allocation takes the index this process has open without checking its file;
    the row, written later, looks the index up (and sees the file deleted meanwhile): it lands in
    the index made again, not in the deleted file."""
    from castor.adapters.materia.artifacts import allocate_cast_id_indexed_later, index_allocated

    allocate_cast_id(tmp_path)  # the index opened, and kept open by this process
    new = allocate_cast_id_indexed_later(tmp_path)
    cast_index.remove_database(str(tmp_path))
    index_allocated(tmp_path, new)
    assert _stored_rows(tmp_path).get(new) == "active"
