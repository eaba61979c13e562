"""castor.adapters.fs: atomic writes, contained paths, JSON lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from castor.adapters.fs import (
    append_json_line,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json_lines,
    safe_join,
)
from castor.messages.errors import ErrorCode, Forbidden


def test_atomic_write_replaces_whole_content_and_leaves_no_temp(tmp_path):
    target = tmp_path / "doc.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"b": [1, 2]})
    assert json.loads(target.read_text()) == {"b": [1, 2]}
    atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "doc.json", "t.txt"]


def test_unserialisable_json_writes_nothing(tmp_path):
    target = tmp_path / "doc.json"
    atomic_write_json(target, {"keep": True})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    with pytest.raises(ValueError):
        atomic_write_json(target, {"nan": float("nan")})
    assert json.loads(target.read_text()) == {"keep": True}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_safe_join_accepts_nested_relative_parts(tmp_path):
    path = safe_join(tmp_path, "sockets/Socket-1", "1.md")
    assert path == (tmp_path / "sockets" / "Socket-1" / "1.md").resolve()


@pytest.mark.parametrize(
    "parts",
    [("..",), ("../x",), ("a/../../x",), ("/etc/passwd",), ("a", "/etc"), ("a\x00b",), ("",), ("ok", "x/../..")],
)
def test_safe_join_refuses_escapes(tmp_path, parts):
    with pytest.raises(Forbidden) as info:
        safe_join(tmp_path, *parts)
    assert info.value.code == ErrorCode.FORBIDDEN
    assert "reason" in info.value.data


def test_safe_join_refuses_symlink_escape(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(Forbidden) as info:
        safe_join(root, "link", "file.txt")
    assert "symlink" in info.value.data["reason"]
    # A symlink that stays inside the root is fine.
    (root / "inner").mkdir()
    (root / "alias").symlink_to(root / "inner")
    assert safe_join(root, "alias", "f") == (root / "inner" / "f").resolve()


def test_json_lines_roundtrip_and_torn_tail_is_skipped_and_sealed(tmp_path):
    log = tmp_path / "events.jsonl"
    append_json_line(log, {"n": 1})
    append_json_line(log, {"n": 2, "text": "line\nbreak"})
    # Simulate a crash in the middle of a write: a fragment without newline.
    with open(log, "ab") as fh:
        fh.write(b'{"n": 3, "tru')
    read = read_json_lines(log)
    assert read.records == [{"n": 1}, {"n": 2, "text": "line\nbreak"}]
    assert read.torn_tail and read.skipped[0].line_no == 3
    # The next append must not fuse with the fragment.
    append_json_line(log, {"n": 4})
    read = read_json_lines(log)
    assert read.records == [{"n": 1}, {"n": 2, "text": "line\nbreak"}, {"n": 4}]
    assert [s.line_no for s in read.skipped] == [3]
    assert not read.torn_tail


def test_final_line_without_newline_is_never_accepted_even_if_it_parses(tmp_path):
    log = tmp_path / "e.jsonl"
    log.write_bytes(b'{"a":1}\n{"b":2}')
    read = read_json_lines(log)
    assert read.records == [{"a": 1}]
    assert read.torn_tail


def test_missing_log_reads_empty(tmp_path):
    read = read_json_lines(tmp_path / "none.jsonl")
    assert read.records == [] and read.skipped == []


def test_atomic_write_leaves_old_file_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    atomic_write_json(target, {"v": 1})

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_json(target, {"v": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


# ----------------------------------------------------------------------------- ConfinedRoot


def test_confined_root_agrees_with_safe_join_and_refuses_the_same_escapes(tmp_path):
    from castor.adapters.fs import ConfinedRoot

    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "a" / "out").symlink_to(outside)
    (root / "inner").symlink_to(root / "a")
    (root / "a" / "leak.md").symlink_to(outside / "secret")
    confined = ConfinedRoot(root)
    for rel in ["x.md", "a/b/c.md", "a/b/c.md", "new/dir/x.md", "inner/x.md", "a/./b/y.md", "a//b/z.md"]:
        assert confined.join(rel) == safe_join(root, rel), rel
    for bad in ["../x", "a/../../x", "/etc/passwd", "a/out/x", "a/out/deeper/x", "a/leak.md", "a\x00b", ""]:
        with pytest.raises(Forbidden):
            safe_join(root, bad)
        with pytest.raises(Forbidden):
            confined.join(bad)


def test_confined_root_sees_symlinks_planted_after_earlier_calls(tmp_path):
    from castor.adapters.fs import ConfinedRoot

    root = tmp_path / "root"
    (root / "d" / "e").mkdir(parents=True)
    confined = ConfinedRoot(root)
    assert confined.join("d/e/f.md") == root / "d" / "e" / "f.md"
    (root / "d" / "e" / "f.md").symlink_to(tmp_path)  # the file becomes a link
    with pytest.raises(Forbidden):
        confined.join("d/e/f.md")
    (root / "d" / "e" / "f.md").unlink()
    (root / "d" / "e").rmdir()
    (root / "d" / "e").symlink_to(tmp_path, target_is_directory=True)  # a used directory becomes a link
    with pytest.raises(Forbidden):
        confined.join("d/e/f.md")


def test_append_json_lines_writes_all_records_in_order_or_none(tmp_path):
    from castor.adapters.fs import append_json_lines

    log = tmp_path / "events.jsonl"
    append_json_lines(log, [{"n": 1}, {"n": 2}])
    append_json_lines(log, [])
    with pytest.raises(ValueError):
        append_json_lines(log, [{"n": 3}, {"bad": float("nan")}])
    append_json_lines(log, [{"n": 4}])
    assert read_json_lines(log).records == [{"n": 1}, {"n": 2}, {"n": 4}]


def test_appending_through_a_planted_symlink_is_refused_and_the_target_untouched(tmp_path):
    """A log is castor's own file: a symlink in its place (to a file outside) is never followed."""
    victim = tmp_path / "outside.txt"
    victim.write_text("precious\n")
    log = tmp_path / "project" / "session.jsonl"
    log.parent.mkdir()
    log.symlink_to(victim)
    with pytest.raises(Forbidden) as err:
        append_json_line(log, {"type": "custom"})
    assert err.value.data["reason"] == "symlink"
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("given", ["/a/.pi/b", "/a//b/", "/a/./b", "/", "/a/b/.", "/x/..hidden/y"])
def test_a_resolved_confined_root_is_spelled_as_pathlib_spells_it(given):
    """A root handed over as already resolved keeps pathlib's spelling, whatever string form it came in."""
    from castor.adapters.fs import ConfinedRoot

    root = ConfinedRoot(given, resolved=True)
    assert root.text == str(Path(given)) and root.root == Path(given)
    joined = root.join_text("sub/file.txt")
    assert joined == f"{str(Path(given)).rstrip('/')}/sub/file.txt"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fails_at", ["write", "fsync"])
def test_an_append_that_meets_a_full_disk_leaves_the_file_as_it_was(tmp_path, monkeypatch, fails_at):
    """A full disk cuts a write short: tmpfs fills the page the file ends in, then answers ENOSPC. The
    append used to leave that torn half line, and the next append (once space was back) sealed it as
    an unparseable line of events.jsonl. A failed append now takes its bytes back: all or nothing."""
    import errno

    from castor.adapters import fs

    log = tmp_path / "events.jsonl"
    fs.append_json_lines(log, [{"n": 1}])
    before = log.read_bytes()
    real_write, real_fsync = fs._write_all, os.fsync

    def short_write(fd: int, data: bytes) -> None:
        real_write(fd, data[: len(data) // 2])  # what fitted in the last page
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # NFS, a thin volume: reported at fsync

    if fails_at == "write":
        monkeypatch.setattr(fs, "_write_all", short_write)
    else:
        monkeypatch.setattr(fs.os, "fsync", failing_fsync)
    with pytest.raises(OSError) as failed:
        fs.append_json_lines(log, [{"n": 2, "pad": "x" * 200}, {"n": 3}])
    assert failed.value.errno == errno.ENOSPC
    monkeypatch.setattr(fs, "_write_all", real_write)
    monkeypatch.setattr(fs.os, "fsync", real_fsync)
    assert log.read_bytes() == before
    fs.append_json_lines(log, [{"n": 4}])  # space is back
    read = read_json_lines(log)
    assert read.records == [{"n": 1}, {"n": 4}] and read.skipped == [], read


def test_a_link_refused_under_a_root_is_named_in_the_message(tmp_path):
    """A link planted in a run directory (``state.json`` pointing out of the project) was refused
    as "path refused (path escapes root (symlink)) under ROOT": the user could not tell which of the
    directory's files to look at. The refusal names the path below the root."""
    from castor.adapters.fs import ConfinedRoot

    (tmp_path / "root" / "cast").mkdir(parents=True)
    (tmp_path / "root" / "cast" / "state.json").symlink_to(tmp_path / "outside.json")
    with pytest.raises(Forbidden) as refused:
        ConfinedRoot(tmp_path / "root").join_text("cast/state.json")
    assert refused.value.message.endswith(": cast/state.json"), refused.value.message
    assert refused.value.data["part"] == "cast/state.json"


_OUT_OF_DESCRIPTORS = r'''
import errno, os, resource, sys
from castor.adapters import fs
from castor.domain.jsontext import js_slice
from castor.domain.materia.state import config_hash

resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
refused = fs.storage_unavailable(OSError(errno.EMFILE, "Too many open files", "/p/caf\u00e9\n.json"), base="/p")
assert refused.data == {"errno": "EMFILE", "path": "caf\\xe9\\n.json"}, refused.data
assert js_slice("\u00e9" * 10, 3) == "\u00e9" * 3
assert config_hash({"a": "\u00e9"})
print("ok")
'''


def test_the_typed_error_of_a_process_out_of_descriptors_is_built_without_one(tmp_path):
    """A process out of file descriptors (``ulimit -n``) must still say so: the ``storage_unavailable``
    that names the file escapes its name with the ``unicode_escape`` codec, and a codec's first use
    imports its module from disk. Out of descriptors that import failed (EMFILE), the error could
    not be built, and the actor building it crashed (``actor_crashed`` for ``cast.status``,
    ``cast.list``, ``cast.recast`` under ``castor serve``). The codecs castor uses besides UTF-8 and
    ASCII are looked up as castor is imported."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS], capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_last_json_line_is_read_from_a_bounded_tail_and_a_torn_line_is_not_one(tmp_path):
    from castor.adapters.fs import read_last_json_line

    log = tmp_path / "events.jsonl"
    assert read_last_json_line(log) is None  # missing
    log.write_text('{"a": 1}\n{"b": 2}\n{"torn')
    assert read_last_json_line(log) == {"b": 2}
    log.write_text(('{"x": "' + "y" * 100 + '"}\n') * 2000 + '{"last": true}\n')
    assert read_last_json_line(log) == {"last": True}
    assert read_last_json_line(log, window=10) is None  # no whole line within the window
    log.write_text('{"a": 1}\nnot json\n')
    assert read_last_json_line(log) is None
    with pytest.raises(ValueError):
        read_last_json_line(tmp_path)


@pytest.mark.timeout(30)
def test_make_durable_dirs_makes_a_new_directory_without_a_stat_and_every_missing_parent_durably(tmp_path, monkeypatch):
    """A cast transition makes a new directory (a socket's) under one that exists: one mkdir and
    its parent's fsync, no stat first. Missing parents are made too, each fsynced in its parent;
    an existing directory (or something else in its place) is left as it is."""
    from castor.adapters import fs

    calls: list[tuple[str, str]] = []
    real_stat, real_mkdir, real_fsync_dir = os.stat, os.mkdir, fs.fsync_dir
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: calls.append(("stat", str(p))) or real_stat(p, *a, **k))
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: calls.append(("mkdir", str(p))) or real_mkdir(p, *a, **k))
    monkeypatch.setattr(fs, "fsync_dir", lambda p: calls.append(("fsync", str(p))) or real_fsync_dir(p))
    fs.make_durable_dirs(f"{tmp_path}/new")
    assert calls == [("mkdir", f"{tmp_path}/new"), ("fsync", str(tmp_path))]
    calls.clear()
    fs.make_durable_dirs(f"{tmp_path}/a/b/c")
    assert [c for c in calls if c[0] == "fsync"] == [("fsync", str(tmp_path)), ("fsync", f"{tmp_path}/a"),
                                                     ("fsync", f"{tmp_path}/a/b")]
    assert os.path.isdir(f"{tmp_path}/a/b/c")
    calls.clear()
    fs.make_durable_dirs(f"{tmp_path}/a/b")  # there already: nothing made, nothing fsynced
    assert [c for c in calls if c[0] == "fsync"] == []
    (tmp_path / "file").write_text("x")
    fs.make_durable_dirs(f"{tmp_path}/file")  # not a directory: left; a write into it says so
    assert (tmp_path / "file").read_text() == "x"
    with pytest.raises(NotADirectoryError):
        fs.make_durable_dirs(f"{tmp_path}/file/sub")


def test_a_bounded_read_allocates_for_the_file_not_for_the_bound(tmp_path):
    import tracemalloc

    from castor.adapters.fs import read_regular_file

    path = tmp_path / "state.json"
    path.write_bytes(b"x" * 32_768)
    tracemalloc.start()
    try:
        raw = read_regular_file(path, 256 * 1024 * 1024)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raw == b"x" * 32_768
    assert peak < 1024 * 1024, peak  # the bound's 256 MiB was allocated for every read before


@pytest.mark.parametrize("grown_to, bound, refused", [(100, 1000, False), (1000, 1000, False), (1001, 1000, True),
                                                      (5000, 1000, True)])
def test_a_file_grown_since_its_size_was_read_is_read_whole_or_refused_past_the_bound(
        tmp_path, monkeypatch, grown_to, bound, refused):
    import os

    from castor.adapters import fs
    from castor.adapters.fs import TooLarge, read_regular_file

    path = tmp_path / "grows"
    path.write_bytes(b"y" * grown_to)
    real_fstat = os.fstat

    class Smaller:  # the size as it was before the file grew
        def __init__(self, st):
            self._st = st

        def __getattr__(self, name):
            return 10 if name == "st_size" else getattr(self._st, name)

    monkeypatch.setattr(fs.os, "fstat", lambda fd: Smaller(real_fstat(fd)))
    if refused:
        with pytest.raises(TooLarge):
            read_regular_file(path, bound)
    else:
        assert read_regular_file(path, bound) == b"y" * grown_to
