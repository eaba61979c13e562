"""castor.adapters.materia.artifacts: layout, id validation, thread-safe appends."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import pytest

from castor.adapters.materia.artifacts import ArtifactCorrupt, CastArtifacts, allocate_cast_id, seg
from castor.messages.errors import Conflict, Forbidden, NotFound

HOSTILE = ["../x", "..", ".", "/etc", "a/b", "a\x00b", "x" * 129, "", "-lead", "sp ace", "a\\b", 12]


@pytest.fixture
def cast(tmp_path):
    return CastArtifacts(tmp_path / "artifacts", "2026-05-12T19-40-40-605Z").create()


def test_layout_matches_spec(cast):
    cast.write_config_resolved({"activeLoadout": "x"})
    cast.init_manifest(request="do it", config_source="bundled")
    cast.write_usage({"tokens": {"total": 0}})
    cast.append_event("cast_start", {"request": "do it"})
    out = cast.write_socket_output("Socket-1", 1, "hello")
    item_out = cast.write_socket_output("Socket-2", 3, "x", item_key="WI 1/../a")
    parsed = cast.write_socket_json("Socket-2", 3, {"satisfied": True})
    refinement = cast.write_refinement("Socket-1", 1, 2, "entry:7", "draft", item_key="k")
    inp = cast.write_utility_input("Socket-3", 1, {"castId": cast.cast_id})
    cmd = cast.write_command_result(
        "Socket-3", 1, stdout="o", stderr="e", stdout_truncated=False, stderr_truncated=True, max_bytes=1048576
    )
    ctx = cast.write_context("Socket-1", 1, "# Materia Isolated Context")
    ctx2 = cast.write_context("Socket-1", 2, "c", item_key="k", suffix="refine 1")
    rel = {cast.relative(p) for p in (out, item_out, parsed, refinement, inp, ctx, ctx2)}
    assert rel == {
        "sockets/Socket-1/1.md",
        "sockets/Socket-2/3-WI-1-..-a.md",
        "sockets/Socket-2/3.json",
        "sockets/Socket-1/1-k.refinement-2-entry-7.md",
        "sockets/Socket-3/1.input.json",
        "contexts/Socket-1-1.md",
        "contexts/Socket-1-k-2-refine-1.md",
    }
    assert (cmd.stdout_rel, cmd.stderr_rel, cmd.meta_rel) == (
        "sockets/Socket-3/1.command.stdout.txt",
        "sockets/Socket-3/1.command.stderr.txt",
        "sockets/Socket-3/1.command.json",
    )
    meta = json.loads(cmd.meta.read_text())
    assert meta["stderrTruncated"] is True and meta["maxBytes"] == 1048576
    names = sorted(p.name for p in cast.run_dir.iterdir())
    assert names == ["config.resolved.json", "contexts", "events.jsonl", "manifest.json", "sockets", "usage.json"]
    assert cast.path("config.resolved.json").read_text().startswith('{\n  "activeLoadout"')


def test_seg_rules():
    assert seg("a b//c") == "a-b-c"
    assert seg("--x--") == "x"
    assert seg("") == "task" and seg("///") == "task" and seg("..") == "task"
    assert len(seg("y" * 1000)) <= 120


@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_cast_ids_are_forbidden(tmp_path, bad):
    with pytest.raises(Forbidden):
        CastArtifacts(tmp_path, bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_socket_ids_are_forbidden(cast, bad):
    with pytest.raises(Forbidden):
        cast.write_socket_output(bad, 1, "x")
    with pytest.raises(Forbidden):
        cast.write_context(bad, 1, "x")
    assert list((cast.run_dir / "sockets").iterdir()) == []


def test_bad_visit_and_escaping_relative_write_are_forbidden(cast):
    for visit in (-1, True, "1"):
        with pytest.raises(Forbidden):
            cast.write_socket_output("Socket-1", visit, "x")
    with pytest.raises(Forbidden):
        cast.write_relative("../escape.txt", "x")
    assert not (cast.run_dir.parent / "escape.txt").exists()


def test_manifest_entries_and_missing_documents(cast):
    with pytest.raises(NotFound):
        cast.read_manifest()
    cast.init_manifest(request="r", config_source="project", session_file="/s.jsonl")
    stored = cast.add_manifest_entry({"phase": "Socket-1", "kind": "context"})
    assert "timestamp" in stored
    manifest = cast.read_manifest()
    assert manifest["castId"] == cast.cast_id and manifest["sessionFile"] == "/s.jsonl"
    assert [e["phase"] for e in manifest["entries"]] == ["Socket-1"]


def test_concurrent_appends_from_many_threads_lose_nothing(cast):
    cast.init_manifest(request="r", config_source="c")
    threads_n, per_thread = 8, 25
    start = threading.Barrier(threads_n)

    def worker(t: int) -> None:
        # A second object for the same cast must share the lock.
        mine = CastArtifacts(cast.artifact_root, cast.cast_id)
        start.wait()
        for i in range(per_thread):
            mine.append_event("tick", {"t": t, "i": i, "pad": "x" * 500})
            mine.add_manifest_entry({"phase": f"{t}-{i}"})

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    log = cast.read_events()
    assert log.skipped == []
    assert sorted((e.data["t"], e.data["i"]) for e in log.events) == [
        (t, i) for t in range(threads_n) for i in range(per_thread)
    ]
    assert len(cast.read_manifest()["entries"]) == threads_n * per_thread


def test_events_report_torn_tail(cast):
    cast.append_event("cast_start", {})
    with open(cast.path("events.jsonl"), "ab") as fh:
        fh.write(b'{"ts":1,"type":"sock')
    log = cast.read_events()
    assert [e.type for e in log.events] == ["cast_start"]
    assert log.skipped and log.skipped[0].torn_tail


def test_allocate_cast_id_is_unique_and_formatted(tmp_path):
    now = datetime(2026, 5, 12, 19, 40, 40, 605000, tzinfo=UTC)
    ids = [allocate_cast_id(tmp_path, now=now) for _ in range(3)]
    assert ids == ["2026-05-12T19-40-40-605Z", "2026-05-12T19-40-40-605Z-1", "2026-05-12T19-40-40-605Z-2"]
    assert all((tmp_path / i).is_dir() for i in ids)


def test_manifest_batch_is_one_rewrite_and_an_outside_rewrite_is_noticed(cast):
    cast.init_manifest(request="r", config_source="c")
    stored = cast.add_manifest_entries([{"phase": "Socket-1", "kind": "context"}, {"phase": "Socket-1", "kind": "x"}])
    assert [e["kind"] for e in stored] == ["context", "x"] and all("timestamp" in e for e in stored)
    # Someone else rewrites the manifest (another writer of this cast): the next append builds on it.
    other = CastArtifacts(cast.artifact_root, cast.cast_id)
    other.add_manifest_entry({"phase": "other", "timestamp": "t"})
    cast.add_manifest_entry({"phase": "Socket-2"})
    manifest = json.loads(cast.path("manifest.json").read_text())
    assert [e["phase"] for e in manifest["entries"]] == ["Socket-1", "Socket-1", "other", "Socket-2"]
    assert manifest["castId"] == cast.cast_id and manifest["request"] == "r" and manifest["configSource"] == "c"
    # A manifest written by anyone else in any JSON layout is read back and extended.
    cast.path("manifest.json").write_text(json.dumps({"castId": "x", "sessionFile": "s", "entries": [{"phase": "p"}]},
                                                     indent=4))
    cast.add_manifest_entry({"phase": "q"})
    manifest = cast.read_manifest()
    assert manifest["sessionFile"] == "s" and [e["phase"] for e in manifest["entries"]] == ["p", "q"]


def test_a_transition_that_writes_the_whole_manifest_keeps_castors_layout_and_appends_without_a_read(
        cast, monkeypatch):
    compact = json.dumps({"castId": cast.cast_id, "request": "r", "configSource": "c", "entries": []})
    cast.write_transition({"manifest.json": compact}, [{"phase": "Socket-1", "kind": "context"}], [])
    text = cast.path("manifest.json").read_text()
    assert text.startswith('{\n  "castId": ') and '\n    {"phase": "Socket-1", "kind": "context"' in text
    monkeypatch.setattr(CastArtifacts, "read_manifest", lambda self: pytest.fail("manifest read back"))
    cast.write_transition({}, [{"phase": "Socket-2"}], [])
    monkeypatch.undo()
    manifest = cast.read_manifest()
    assert manifest["request"] == "r" and [e["phase"] for e in manifest["entries"]] == ["Socket-1", "Socket-2"]
    with pytest.raises(ArtifactCorrupt):  # a whole manifest that is not a JSON object writes nothing
        cast.write_transition({"manifest.json": "[1]"}, [], [])
    assert cast.read_manifest() == manifest


def test_append_events_batch_round_trips_in_order(cast):
    cast.append_event("cast_start", {"request": "r"}, ts_ms=1)
    cast.append_events([("socket_start", {"socket": "Socket-1"}, 2), ("cast_end", {"ok": True}, 3)])
    with pytest.raises(ValueError):
        cast.append_events([("fine", {}, 4), ("", {}, 5)])
    log = cast.read_events()
    assert [(e.ts, e.type) for e in log.events] == [(1, "cast_start"), (2, "socket_start"), (3, "cast_end")]
    assert log.events[2].data == {"ok": True} and not log.skipped


@pytest.mark.parametrize("data", [
    {}, None, {"socket": "Socket-1", "visit": 3, "parsed": False, "materiaModel": {"source": "active", "label": "x"}},
    {"text": "é \u2028 \x1f \x7f \" \\ / \n\t", "n": -(10 ** 30), "f": 1e-05, "g": 1e20, "h": 0.1, "none": None,
     "list": [1, "a", [True, None], {"k": 2.5}], "tuple": (1, 2)},
])
def test_an_event_line_is_exactly_the_compact_json_of_its_record(cast, data):
    """events.jsonl's lines are written with their fixed fields made by hand: byte for byte what
    the whole record through compact_json gives, whatever the data holds."""
    from castor.adapters.fs import compact_json
    from castor.adapters.materia.artifacts import _event_lines

    events = [("socket_complete", data, 1796623433006), ("t\u00e9\"x", data, True)]
    assert _event_lines(events) == [compact_json({"ts": int(ts), "type": t, "data": d or {}}) for t, d, ts in events]
    cast.write_transition({}, [], events)
    lines = (cast.run_dir / "events.jsonl").read_text(encoding="utf-8").split("\n")[:-1]  # not splitlines: U+2028
    assert lines == [compact_json({"ts": int(ts), "type": t, "data": d or {}}) for t, d, ts in events]
    with pytest.raises(ValueError):
        _event_lines([("", {}, 1)])
    with pytest.raises(ValueError):  # NaN is not JSON: refused before anything is appended
        cast.write_transition({}, [], [("e", {"x": float("nan")}, 2)])
    assert (cast.run_dir / "events.jsonl").read_text(encoding="utf-8").split("\n")[:-1] == lines


def test_an_artifact_root_that_is_a_file_is_a_conflict_not_a_crash(tmp_path):
    root = tmp_path / "pi-materia"
    root.write_text("not a directory")
    with pytest.raises(Conflict) as err:
        allocate_cast_id(root)
    assert err.value.data["reason"] == "artifact_root_not_a_directory"
    assert root.read_text() == "not a directory"


@pytest.mark.timeout(30)
def test_a_manifest_appended_to_keeps_castor_s_layout_byte_for_byte(cast):
    """An append encodes and joins only its new entry lines onto the ones it wrote last; the file
    is always the layout written whole: the fields one a line, then one entry a line."""
    from castor.adapters.fs import one_line_json

    def whole(meta: dict, entries: list) -> bytes:
        fields = "".join(f"  {one_line_json(k)}: {one_line_json(v)},\n" for k, v in meta.items())
        lines = ",\n    ".join(one_line_json(e) for e in entries)
        return ("{\n" + fields + (f'  "entries": [\n    {lines}\n  ]\n}}\n' if entries else '  "entries": []\n}\n')
                ).encode()

    meta = {"castId": cast.cast_id, "request": "r é \u2028 \"q\"", "configSource": "c"}
    cast.init_manifest(request=meta["request"], config_source="c")
    assert cast.path("manifest.json").read_bytes() == whole(meta, [])
    entries: list = []
    for n in range(4):
        batch = [{"kind": "k", "n": n, "text": "ü\\\"\n", "timestamp": n}, {"kind": "f", "f": 1e-5, "timestamp": 9}]
        cast.write_transition({f"sockets/S-{n}/1.md": "x"}, batch, [])
        entries += batch
        assert cast.path("manifest.json").read_bytes() == whole(meta, entries)
    other = CastArtifacts(cast.artifact_root, cast.cast_id)  # another writer: the next append re-reads
    other.add_manifest_entries([{"kind": "other", "timestamp": 1}])
    cast.add_manifest_entries([{"kind": "last", "timestamp": 2}])
    entries += [{"kind": "other", "timestamp": 1}, {"kind": "last", "timestamp": 2}]
    assert cast.path("manifest.json").read_bytes() == whole(meta, entries)


@pytest.mark.timeout(30)
def test_an_allocation_never_makes_its_directory_through_a_link_at_its_name(tmp_path):
    """The new run directory's ``mkdir`` is made at the root's own name for it: a link planted
    there (even a dangling one whose target is inside the root) is ``EEXIST``, and the next name is
    taken; nothing is made where the link leads."""
    now = datetime(2026, 5, 12, 19, 40, 40, 605000, tzinfo=UTC)
    (tmp_path / "2026-05-12T19-40-40-605Z").symlink_to(tmp_path / "elsewhere")
    assert allocate_cast_id(tmp_path, now=now) == "2026-05-12T19-40-40-605Z-1"
    assert not (tmp_path / "elsewhere").exists() and (tmp_path / "2026-05-12T19-40-40-605Z").is_symlink()
    assert (tmp_path / "2026-05-12T19-40-40-605Z-1").is_dir()


@pytest.mark.timeout(30)
def test_an_artifact_root_removed_or_replaced_after_a_first_allocation_is_made_again_or_refused(tmp_path):
    """A root whose index this process has open is not looked at before the mkdir: the mkdir says
    it is gone (made again, private) or not a directory (refused, as before)."""
    import os
    import shutil
    import stat

    root = tmp_path / "artifacts"
    first = allocate_cast_id(root)
    assert (root / first).is_dir()
    shutil.rmtree(root)
    again = allocate_cast_id(root)
    assert (root / again).is_dir() and stat.S_IMODE(os.stat(root).st_mode) == 0o700
    shutil.rmtree(root)
    root.write_text("a file")
    with pytest.raises(Conflict) as refused:
        allocate_cast_id(root)
    assert refused.value.data["reason"] == "artifact_root_not_a_directory"
