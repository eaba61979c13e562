"""The atomic-write sequence of castor.adapters.fs, step by step and deterministically.

``atomic_write_bytes`` must: write a temporary file in the target's directory, fsync it, close
it, rename it over the target, then fsync the directory. Two kinds of test:

* the syscall sequence itself, recorded through a wrapper around the ``os`` module that fs uses;
* a real process that dies (``os._exit``, no clean-up, like ``kill -9``) at each step of the
  sequence — also half-way through the data — after which the target is read back: it is always
  exactly the old document or exactly the new one, never torn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters import fs

OLD = {"revision": 1, "body": "o" * 200_000}
NEW = {"revision": 2, "body": "n" * 300_000}


class _RecordingOs:
    """Delegates to ``os``; records open/write/fsync/close/replace with the path of each fd."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}
        self._fail_at = fail_at

    def __getattr__(self, name):
        return getattr(os, name)

    def _step(self, name: str, path: str) -> None:
        self.calls.append((name, path))
        if self._fail_at == name:
            raise OSError(28, f"injected failure at {name}")

    def open(self, path, flags, mode=0o777, **kw):
        fd = os.open(path, flags, mode, **kw)
        self._paths[fd] = os.fspath(path)
        self.calls.append(("open", os.fspath(path)))
        return fd

    def write(self, fd, data):
        self._step("write", self._paths.get(fd, "?"))
        return os.write(fd, data)

    def fsync(self, fd):
        self._step("fsync", self._paths.get(fd, "?"))
        return os.fsync(fd)

    def close(self, fd):
        self.calls.append(("close", self._paths.pop(fd, "?")))
        return os.close(fd)

    def replace(self, src, dst):
        self._step("replace", f"{os.fspath(src)} -> {os.fspath(dst)}")
        return os.replace(src, dst)


def test_temp_write_then_file_fsync_then_rename_then_directory_fsync_in_that_order(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    fs.atomic_write_json(target, OLD)
    recorder = _RecordingOs()
    monkeypatch.setattr(fs, "os", recorder)
    fs.atomic_write_json(target, NEW)
    steps = [(name, path) for name, path in recorder.calls if name != "write"]
    tmp = steps[0][1]
    assert Path(tmp).parent == tmp_path and Path(tmp).name.startswith(".doc.json.") and tmp != str(target)
    assert steps == [("open", tmp), ("fsync", tmp), ("close", tmp), ("replace", f"{tmp} -> {target}"),
                     ("open", str(tmp_path)), ("fsync", str(tmp_path)), ("close", str(tmp_path))]
    writes = [path for name, path in recorder.calls if name == "write"]
    assert writes and set(writes) == {tmp}  # the data goes to the temp file only, never the target
    last_write = max(i for i, (name, _path) in enumerate(recorder.calls) if name == "write")
    assert last_write < recorder.calls.index(("fsync", tmp))  # every byte written before the fsync
    assert json.loads(target.read_text()) == NEW
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json"]


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_failing_step_leaves_the_old_document_and_no_temp_file(tmp_path, monkeypatch, step):
    target = tmp_path / "doc.json"
    fs.atomic_write_json(target, OLD)
    monkeypatch.setattr(fs, "os", _RecordingOs(fail_at=step))
    with pytest.raises(OSError):
        fs.atomic_write_json(target, NEW)
    monkeypatch.undo()
    assert json.loads(target.read_text()) == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json"]


_DIE_AT = r'''
import json, os, sys
from castor.adapters import fs

target, step, new = sys.argv[1], sys.argv[2], json.load(sys.stdin)
real = os


class DyingOs:
    """Exits the process (no clean-up, like kill -9) right after the named step."""

    def __getattr__(self, name):
        return getattr(real, name)

    def write(self, fd, data):
        if step == "mid_write":  # half the bytes reach the temp file, then the process dies
            real.write(fd, bytes(data)[: len(data) // 2])
            real._exit(0)
        n = real.write(fd, data)
        if step == "write":
            real._exit(0)
        return n

    def fsync(self, fd):
        real.fsync(fd)
        if step == "fsync" and fd not in dirs:
            real._exit(0)
        if step == "dir_fsync" and fd in dirs:
            real._exit(0)

    def open(self, path, flags, mode=0o777, **kw):
        fd = real.open(path, flags, mode, **kw)
        if real.path.isdir(path):
            dirs.add(fd)
        return fd

    def replace(self, src, dst):
        real.replace(src, dst)
        if step == "replace":
            real._exit(0)


dirs = set()
if len(sys.argv) > 3:  # through the cast state store: ROOT CAST_ID INCARNATION
    from castor.adapters.materia.state_store import CastStateStore

    store = CastStateStore(sys.argv[3])
    fs.os = DyingOs()
    store.save(sys.argv[4], new, incarnation=int(sys.argv[5]))
else:
    fs.os = DyingOs()
    fs.atomic_write_json(target, new)
real._exit(3)  # the write finished: the step was never reached
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step, expected", [("mid_write", "old"), ("write", "old"), ("fsync", "old"),
                                            ("replace", "new"), ("dir_fsync", "new")])
def test_a_process_dying_at_each_step_leaves_the_old_or_the_new_document_never_a_torn_one(tmp_path, step,
                                                                                          expected):
    target = tmp_path / "state.json"
    fs.atomic_write_json(target, OLD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(fs.__file__).parents[2]),
                                                                    os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", _DIE_AT, str(target), step], input=json.dumps(NEW), env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, (done.returncode, done.stderr)  # died at the step, not before, not after
    read_back = json.loads(target.read_text())
    assert read_back == (OLD if expected == "old" else NEW)
    strays = [p.name for p in tmp_path.iterdir() if p.name != "state.json"]
    assert all(name.startswith(".state.json.") and name.endswith(".tmp") for name in strays)
    assert (strays != []) == (step in ("mid_write", "write", "fsync"))  # a dead writer's temp file stays
    fs.atomic_write_json(target, {"revision": 3})  # and a later write is not disturbed by it
    assert json.loads(target.read_text()) == {"revision": 3}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step, expected", [("mid_write", "old"), ("fsync", "old"), ("replace", "new")])
def test_a_cast_state_save_dying_at_each_step_loads_as_the_old_or_the_new_state(tmp_path, step, expected):
    from castor.adapters.materia.state_store import CastStateStore

    store = CastStateStore(tmp_path)
    incarnation = store.claim("c1")
    store.save("c1", OLD, incarnation=incarnation)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(fs.__file__).parents[2]),
                                                                    os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", _DIE_AT, "-", step, str(tmp_path), "c1", str(incarnation)],
                          input=json.dumps(NEW), env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, (done.returncode, done.stderr)
    stored = CastStateStore(tmp_path).load("c1")  # a fresh store: nothing remembered, the file decides
    assert (stored.state, stored.revision) == ((OLD, 1) if expected == "old" else (NEW, 2))
