"""Storage faults are typed outcomes: a full (or failing, read-only, forbidden) disk under a cast's
state or artifacts gives ``storage_unavailable`` to the caller, never a crash loop, never debris
that lists as ``unreadable``, and a cast that meets one mid-run stays recastable.

Two layers:
- fault injection in-process (the file layer's one ``write`` raising ``OSError(errno)`` for files
  under the project), once per errno;
- a real 2 MiB tmpfs project (mounted by the test; root only, skipped otherwise) driven through a
  real ``castor serve`` over its Unix socket, with a second session on a normal disk.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from castor.actors.materia.api import materia_call
from castor.adapters import fs
from castor.messages.errors import CastorError, StorageUnavailable
from tests.actors.materia.helpers import make_runtime, open_session, wait_for, wait_status

from . import conftest as security
from .conftest import SocketServer, castor_argv

_CLEAN_ENV = security.serve_env


def serve_env(tmp: Path) -> dict[str, str]:
    """The security tests' clean environment, keeping PYTHONPATH (so a worktree runs its own code)."""
    env = _CLEAN_ENV(tmp)
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env

ERRNOS = ["ENOSPC", "EDQUOT", "EIO", "EROFS", "EACCES", "EMFILE"]


def _opened_under(fd: int, root: str) -> bool:
    """Whether ``fd`` is a file or directory under ``root`` (read from /proc; False if it cannot be)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(root)
    except OSError:
        return False


class DiskFault:
    """Makes the file layer's ``write`` fail with ``errno`` for files under ``root`` while on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = str(root.resolve())
        self.errno: int | None = None
        self.times: int | None = None  # None: every write; N: the next N writes only
        self.hits = 0
        real = fs._write_all

        def write_all(fd: int, data: bytes) -> None:
            if self.errno is not None and (self.times is None or self.times > 0):
                if _opened_under(fd, self.root):
                    self.hits += 1
                    if self.times is not None:
                        self.times -= 1
                    raise OSError(self.errno, os.strerror(self.errno))
            real(fd, data)

        monkeypatch.setattr(fs, "_write_all", write_all)

    def on(self, name: str, times: int | None = None) -> None:
        self.errno, self.times = getattr(errno, name), times

    def off(self) -> None:
        self.errno = None


@pytest.fixture
def crashes():
    """Every "actor crashed" log record while the test runs."""
    seen: list[str] = []
    logger.enable("castor")  # as a program that reads castor's log does (a library's lines are off until then)
    sink = logger.add(lambda m: seen.append(m.record["extra"].get("actor", "?")),
                      filter=lambda r: "actor crashed" in r["message"], level="ERROR")
    yield seen
    logger.remove(sink)


@pytest.fixture
def runtime():
    rt = make_runtime()
    yield rt
    rt.shutdown(10.0)


def _cast_dirs(project: Path) -> list[Path]:
    root = project / ".pi" / "pi-materia"
    return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")] if root.is_dir() else []


def _artifact_root(rt, sid: str) -> Path:
    return Path(materia_call(rt, sid, "list", {})["artifact_root"])


@pytest.mark.parametrize("name", ERRNOS)
def test_a_start_on_failing_storage_is_storage_unavailable_and_leaves_nothing(
        runtime, tmp_path, monkeypatch, crashes, name):
    project = tmp_path / "project"
    project.mkdir()
    _agent, _ui = open_session(runtime, "s1", project, ["hi", "hi again"])
    fault = DiskFault(monkeypatch, project)
    fault.on(name)
    with pytest.raises(StorageUnavailable) as refused:
        materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    err = refused.value
    assert err.code == "storage_unavailable" and err.data["errno"] == name, err.to_wire()
    assert not err.data["path"].startswith("/") and err.data["path"].startswith(".pi/"), err.data
    assert fault.hits >= 1
    assert crashes == [], "a storage fault must not crash (and restart) the cast actor"
    root = _artifact_root(runtime, "s1")
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == []  # no debris
    rows = materia_call(runtime, "s1", "list", {})["casts"]
    assert [r for r in rows if r["status"] == "unreadable"] == []
    fault.off()  # fixed: the same session starts and completes a cast
    started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    assert wait_status(runtime, "s1", started["cast_id"])["status"] == "complete"


class FsyncFault:
    """Makes ``os.fsync`` fail with ``errno`` for files and directories under ``root`` while on,
    every write still succeeding: a device that takes the bytes and then cannot make them durable
    (``EIO`` from a failing disk, ``ENOSPC`` from thin provisioning or a network file system)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = str(root.resolve())
        self.errno: int | None = None
        self.hits = 0
        real = os.fsync

        def fsync(fd: int) -> None:
            if self.errno is not None:
                if _opened_under(fd, self.root):
                    self.hits += 1
                    raise OSError(self.errno, os.strerror(self.errno))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def on(self, name: str) -> None:
        self.errno = getattr(errno, name)

    def off(self) -> None:
        self.errno = None


@pytest.mark.parametrize("name", ["ENOSPC", "EIO"])
def test_a_start_whose_run_directory_cannot_be_made_durable_leaves_nothing(
        runtime, tmp_path, monkeypatch, crashes, name):
    """The run directory's ``mkdir`` succeeds and the fsync that makes it durable fails: the
    directory used to stay behind, empty, and list as ``unreadable`` (until a reader took it for an
    abandoned start a minute later). The start is refused and the directory taken back."""
    project = tmp_path / "project"
    project.mkdir()
    open_session(runtime, "s1", project, ["hi"])
    root = project / ".pi" / "pi-materia"
    root.mkdir(parents=True)
    fault = FsyncFault(monkeypatch, project)
    fault.on(name)
    with pytest.raises(StorageUnavailable) as refused:
        materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    assert refused.value.data["errno"] == name, refused.value.to_wire()
    assert fault.hits >= 1
    fault.off()
    assert crashes == []
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == []  # no debris
    rows = materia_call(runtime, "s1", "list", {})["casts"]
    assert rows == [], rows
    started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    assert wait_status(runtime, "s1", started["cast_id"])["status"] == "complete"


def test_status_of_a_cast_its_storage_stopped_says_what_happened_and_what_to_type(
        runtime, tmp_path, monkeypatch, crashes):
    """A run directory that takes no new file (``chmod 0555`` for a user other than root: EACCES on
    the state's temporary file) while its events log still takes appends: the cast stops, its failed
    state cannot be saved, and the log's last event says why. ``status`` showed only ``orphaned``
    and the recast command; it now names the fault and what to do."""
    project = tmp_path / "project"
    project.mkdir()
    open_session(runtime, "s1", project, [{"text": "lost", "delay_ms": 400}, "after recast"])
    cast_id = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})["cast_id"]
    materia_call(runtime, "s1", "status", {"cast_id": cast_id})  # answered after the start's files and first turn
    run_dir = str((project / ".pi" / "pi-materia" / cast_id).resolve())
    real_open = os.open
    refusing = {"on": True}

    def no_new_files(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if refusing["on"] and flags & os.O_EXCL and os.fspath(path).startswith(run_dir + "/"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", no_new_files)
    wait_for(lambda: runtime.system.find(f"/root/session/s1/cast/{cast_id}") is None, timeout=15,
             what="the cast actor stopped")
    assert crashes == []
    view = materia_call(runtime, "s1", "status", {"cast_id": cast_id})
    assert view["status"] == "orphaned", view
    assert view["storage_fault"]["errno"] == "EACCES", view
    assert view["storage_fault"]["path"] == f".pi/pi-materia/{cast_id}/state.json", view
    assert "stopped: storage unavailable (EACCES on .pi/pi-materia/" in view["text"], view["text"]
    assert f"then castor recast {cast_id}" in view["text"], view["text"]
    refusing["on"] = False
    materia_call(runtime, "s1", "recast", {"cast_id": cast_id})
    assert wait_status(runtime, "s1", cast_id)["status"] == "complete"
    assert "storage_fault" not in materia_call(runtime, "s1", "status", {"cast_id": cast_id})


@pytest.mark.parametrize("name", ERRNOS)
def test_a_cast_that_meets_a_storage_fault_mid_run_stops_tells_the_harness_and_recasts(
        runtime, tmp_path, monkeypatch, crashes, name):
    project = tmp_path / "project"
    project.mkdir()
    _agent, ui = open_session(runtime, "s1", project, [{"text": "lost", "delay_ms": 400}, "after recast"])
    fault = DiskFault(monkeypatch, project)
    started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id = started["cast_id"]
    materia_call(runtime, "s1", "status", {"cast_id": cast_id})  # answered after the start's files and first turn
    fault.on(name)  # before the turn's answer: its transition cannot be saved
    wait_for(lambda: runtime.system.find(f"/root/session/s1/cast/{cast_id}") is None, timeout=15,
             what="the cast actor stopped")
    assert crashes == []
    view = materia_call(runtime, "s1", "status", {"cast_id": cast_id})
    # Every write fails, so the failed state cannot be saved either: it stays as last saved
    # (active, lease free) = orphaned, resumable.
    assert view["status"] == "orphaned" and view["resumable"] is True, view
    told = [m for level, m in ui.notifications if level == "error" and cast_id in m]
    assert told and "storage unavailable" in told[0] and name in told[0], ui.notifications
    fault.off()
    materia_call(runtime, "s1", "recast", {"cast_id": cast_id})
    done = wait_status(runtime, "s1", cast_id)
    assert done["status"] == "complete", done
    assert (Path(done["run_dir"]) / "sockets" / "Socket-1" / "1.md").read_text().strip() == "after recast"


def test_a_one_off_fault_mid_run_fails_the_cast_with_its_reason_and_its_own_event(
        runtime, tmp_path, monkeypatch, crashes):
    project = tmp_path / "project"
    project.mkdir()
    _agent, ui = open_session(runtime, "s1", project, [{"text": "lost", "delay_ms": 400}, "after recast"])
    fault = DiskFault(monkeypatch, project)
    started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id, run_dir = started["cast_id"], Path(started["run_dir"])
    materia_call(runtime, "s1", "status", {"cast_id": cast_id})  # answered after the start's files and first turn
    fault.on("ENOSPC", times=1)  # the answer's save fails; the space is back for the failed state
    wait_for(lambda: runtime.system.find(f"/root/session/s1/cast/{cast_id}") is None, timeout=15,
             what="the cast actor stopped")
    assert crashes == []
    view = materia_call(runtime, "s1", "status", {"cast_id": cast_id})
    assert view["status"] == "failed" and view["resumable"] is True, view
    assert "storage unavailable" in view["failed_reason"] and "ENOSPC" in view["failed_reason"]
    # the turn ran and ended; its outcome could not be saved: never "Could not start agent turn ..."
    assert view["failed_reason"].startswith("storage unavailable: "), view["failed_reason"]
    assert view.get("artifacts_pending") is False
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    types = [r["type"] for r in records]
    assert "cast_end" in types and types[-1] == "storage_unavailable", types
    assert records[-1]["data"]["errno"] == "ENOSPC"
    assert any(level == "error" for level, _m in ui.notifications)
    materia_call(runtime, "s1", "recast", {"cast_id": cast_id})
    assert wait_status(runtime, "s1", cast_id)["status"] == "complete"



@pytest.mark.timeout(60)
def test_a_recast_refused_by_a_full_disk_names_the_file_relative_to_the_project(
        runtime, tmp_path, monkeypatch, crashes):
    """A new cast's storage fault named ``.pi/pi-materia/<id>/state.json``; a recast's (the cast's
    start from its saved state, before that state is loaded) named the absolute path -- the project
    the error is relative to came from the start event or the loaded state, and a recast has
    neither yet. It is the session's project now."""
    project = tmp_path / "project"
    project.mkdir()
    open_session(runtime, "s1", project, [{"text": "lost", "delay_ms": 400}, "after recast"])
    fault = DiskFault(monkeypatch, project)
    cast_id = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})["cast_id"]
    materia_call(runtime, "s1", "status", {"cast_id": cast_id})  # answered after the start's files and first turn
    fault.on("ENOSPC")
    wait_for(lambda: runtime.system.find(f"/root/session/s1/cast/{cast_id}") is None, timeout=15,
             what="the cast actor stopped")
    with pytest.raises(StorageUnavailable) as refused:
        materia_call(runtime, "s1", "recast", {"cast_id": cast_id})
    assert refused.value.data["path"] == f".pi/pi-materia/{cast_id}/state.json", refused.value.to_wire()
    assert str(project) not in refused.value.message, refused.value.message
    assert crashes == []
    fault.off()
    materia_call(runtime, "s1", "recast", {"cast_id": cast_id})
    assert wait_status(runtime, "s1", cast_id)["status"] == "complete"


def test_a_state_that_cannot_be_read_is_storage_unavailable_not_internal(runtime, tmp_path, monkeypatch, crashes):
    project = tmp_path / "project"
    project.mkdir()
    open_session(runtime, "s1", project, ["hi"])
    started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id = started["cast_id"]
    assert wait_status(runtime, "s1", cast_id)["status"] == "complete"
    from castor.adapters.materia import state_store

    real = state_store._read_state_text

    def failing(path):  # the disk fails where state.json is read
        if path.name == "state.json" and str(path).startswith(str(project.resolve())):
            raise OSError(errno.EIO, "Input/output error")
        return real(path)

    monkeypatch.setattr(state_store, "_read_state_text", failing)
    for verb in ("status", "recast"):
        with pytest.raises(StorageUnavailable) as refused:
            materia_call(runtime, "s1", verb, {"cast_id": cast_id})
        assert refused.value.data["errno"] == "EIO", refused.value.to_wire()
        # the file relative to the project, as every storage error names it (status named it absolute)
        assert refused.value.data["path"] == f".pi/pi-materia/{cast_id}/state.json", refused.value.to_wire()
        assert str(project.resolve()) not in refused.value.message, refused.value.message
    assert crashes == []


def test_a_file_error_from_a_verb_is_typed_never_internal(runtime, tmp_path, monkeypatch):
    """Any OSError under a verb is the project's storage, not castor: storage_unavailable."""
    project = tmp_path / "project"
    project.mkdir()
    open_session(runtime, "s1", project, ["hi"])
    from castor.adapters.materia.storage import FileCastStorage

    def refuse(*_a: Any, **_k: Any) -> str:
        raise OSError(errno.ENOTDIR, "Not a directory", str(project / ".pi" / "pi-materia"))

    monkeypatch.setattr(FileCastStorage, "allocate_cast_id", refuse)  # the session's cast storage
    with pytest.raises(CastorError) as refused:
        materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    assert refused.value.code == "storage_unavailable", refused.value.to_wire()
    assert refused.value.data == {"errno": "ENOTDIR", "path": ".pi/pi-materia", "verb": "start",
                                  "artifact_root": ".pi/pi-materia"}
    assert refused.value.message == ("storage unavailable: cannot create the cast's run directory in "
                                     ".pi/pi-materia (ENOTDIR: Not a directory)"), refused.value.message



def _project_of_length(tmp_path: Path, length: int) -> Path:
    """A project directory whose absolute path is ``length`` characters (nested 240-character names)."""
    path = tmp_path
    while len(str(path)) < length - 250:
        path = path / ("d" * 240)
    path = path / ("e" * (length - len(str(path)) - 1))
    path.mkdir(parents=True)
    assert len(str(path)) == length
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("length", [4000, 4012, 4020, 4030, 4045, 4060])
def test_a_project_path_too_long_for_the_casts_files_is_storage_unavailable_never_a_crash_loop(
        runtime, tmp_path, crashes, length):
    """Near PATH_MAX (4,096 on Linux) a cast's deeper files no longer have a name the kernel takes:
    ENAMETOOLONG was not a storage fault, so the CastActor crashed at that file and its restarts
    met it again (7 crashes a cast); at the start the caller got ``not_found: no persisted state``.
    It is now ``storage_unavailable`` (errno ENAMETOOLONG) like any other the storage refuses: at
    the start, or a cast that stops recastable, never a crash."""
    project = _project_of_length(tmp_path, length)
    open_session(runtime, "s1", project, ["hi"] * 4)
    try:
        started = materia_call(runtime, "s1", "start", {"request": "x", "loadout": "hello"})
    except CastorError as refused:
        assert refused.code == "storage_unavailable", refused.to_wire()
        assert refused.data["errno"] == "ENAMETOOLONG", refused.to_wire()
    else:
        cast_id = started["cast_id"]
        wait_for(lambda: runtime.system.find(f"/root/session/s1/cast/{cast_id}") is None, timeout=30,
                 what="the cast actor stopped")
        view = materia_call(runtime, "s1", "status", {"cast_id": cast_id})
        assert view["status"] == "complete" or view["resumable"] is True, view
    assert crashes == [], crashes


# --------------------------------------------------------------------------- a real full disk


class Harness:
    """A harness client over the real socket: answers agent.run_turn (after ``hold`` is set, if any)."""

    def __init__(self, server: SocketServer, sid: str, cwd: Path) -> None:
        self.client = server.client()
        self.sid = sid
        self.notes: list[dict] = []
        self.turns: list[dict] = []
        self.hold: threading.Event | None = None
        self.client.on_notification("agent.run_turn", self._run_turn)
        self.client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
        self.client.on_notification("ui.notify", self.notes.append)
        self.client.on_notification("ui.status", lambda _p: None)
        self.client.on_notification("message.send", lambda _p: None)
        self.client.call("session.open", {"session_id": sid, "cwd": str(cwd), "trusted": True}, timeout=20)
        self.client.call("loadout.set", {"session_id": sid, "name": "hello"}, timeout=20)

    def _run_turn(self, params: dict) -> None:
        self.turns.append(params)

        def answer() -> None:
            if self.hold is not None:
                self.hold.wait(30)
            try:
                self.client.call("agent.turn_ended", {"session_id": self.sid, "turn_id": params["turn_id"],
                                                      "text": "answer", "stop_reason": "stop"}, timeout=20)
            except CastorError:
                pass

        threading.Thread(target=answer, daemon=True).start()

    def call(self, method: str, **params: Any) -> Any:
        return self.client.call(method, {"session_id": self.sid, **params}, timeout=20)

    def run_cast(self) -> dict:
        cast_id = self.call("cast.start", request="x")["cast_id"]
        return wait_for(lambda: (v := self.call("cast.status", cast_id=cast_id))["status"] in
                        ("complete", "failed", "orphaned") and v, timeout=20, what="the cast to end")


def _fill(directory: Path) -> Path:
    filler = directory / "filler.bin"
    with open(filler, "wb", buffering=0) as handle:  # unbuffered: close() has nothing left to flush
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _casts_json(project: Path, tmp: Path) -> list[dict]:
    done = subprocess.run(castor_argv("casts", "--cwd", str(project), "--json"), env=serve_env(tmp),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def tiny_disk(tmp_path: Path):
    from tests.support.tmpfs import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "tiny", "2m") as mount:
        yield mount


@pytest.mark.timeout(120)
def test_a_full_tmpfs_project_over_the_real_endpoint(tmp_path, tiny_disk, monkeypatch):
    monkeypatch.setattr(security, "serve_env", serve_env)
    project = tiny_disk / "project"
    project.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    server = SocketServer(tmp_path)
    try:
        full = Harness(server, "full", project)
        normal = Harness(server, "normal", other)
        assert full.run_cast()["status"] == "complete"  # fits while there is room

        # 1. a full disk: cast.start answers storage_unavailable, and leaves nothing behind
        filler = _fill(tiny_disk)
        for _ in range(3):
            with pytest.raises(CastorError) as refused:
                full.call("cast.start", request="x")
            assert refused.value.code == "storage_unavailable", refused.value.to_wire()
            assert refused.value.data["errno"] == "ENOSPC" and not refused.value.data["path"].startswith("/")
            assert normal.run_cast()["status"] == "complete"  # the other session keeps working
        rows = _casts_json(project, tmp_path)
        assert [r for r in rows if r["status"] == "unreadable"] == [] and len(rows) == 1, rows
        assert server.alive()

        # 2. mid-run: the disk fills while a turn runs; the harness is told, the cast recastable
        filler.unlink()
        full.hold = threading.Event()
        cast_id = full.call("cast.start", request="y")["cast_id"]
        wait_for(lambda: full.turns and full.turns[-1].get("turn_id"), timeout=20, what="the turn")
        filler = _fill(tiny_disk)
        full.hold.set()
        ended = wait_for(lambda: (v := full.call("cast.status", cast_id=cast_id))["status"] in ("failed", "orphaned")
                         and not v["live"] and v, timeout=20, what="the cast stopped")
        assert ended["resumable"] is True, ended
        wait_for(lambda: any(cast_id in n.get("message", "") and n.get("level") == "error" for n in full.notes),
                 timeout=10, what="ui.notify of the storage fault")
        assert normal.run_cast()["status"] == "complete"
        assert [r for r in _casts_json(project, tmp_path) if r["status"] == "unreadable"] == []

        # 3. space freed: `castor recast` completes it
        filler.unlink()
        script = tmp_path / "script.json"
        script.write_text(json.dumps(["recast answer"]))
        done = subprocess.run(castor_argv("recast", cast_id, "--cwd", str(project), "--agent", f"script:{script}",
                                          "--quiet"), env=serve_env(tmp_path), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        row = next(r for r in _casts_json(project, tmp_path) if r["cast_id"] == cast_id)
        assert row["status"] == "complete", row
        assert server.alive()
        log = server.stderr_path.read_text(errors="replace")
        assert "actor crashed" not in log, log[-3000:]
    finally:
        server.stop()


@pytest.mark.parametrize("raised", [CastorError("a castor bug"), RuntimeError("another castor bug")])
def test_internal_always_carries_an_error_id_that_is_in_the_log(raised):
    """``internal`` is castor's own bug: the caller gets an error_id, the log line has the same id."""
    from castor.endpoint.dispatch import Context, Dispatcher

    dispatcher = Dispatcher()

    def broken(_params, _ctx):
        raise raised

    dispatcher.register("test.broken", broken)
    logged: list[dict] = []
    logger.enable("castor")  # as a program that reads castor's log does (a test before may have turned it off)
    sink = logger.add(lambda m: logged.append(dict(m.record["extra"])), level="ERROR")
    try:
        with pytest.raises(CastorError) as answered:
            dispatcher.dispatch("test.broken", {}, Context(connection=None, state={}, method="test.broken"))
    finally:
        logger.remove(sink)
    wire = answered.value.to_wire()
    assert wire["code"] == "internal" and len(wire["data"]["error_id"]) == 12, wire
    assert any(extra.get("error_id") == wire["data"]["error_id"] for extra in logged), logged


@pytest.fixture
def read_only_pi(tmp_path: Path):
    """A project whose ``.pi`` is a real read-only bind mount (root only), with one failed cast in it."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root")
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text('{"activeLoadout": "Planning-Consult"}\n')
    pi = project / ".pi"
    done = subprocess.run(["mount", "--bind", str(pi), str(pi)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode(errors='replace').strip()}")
    try:
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(pi)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {done.stderr.decode(errors='replace').strip()}")
        yield project
    finally:
        subprocess.run(["umount", "-l", str(pi)], capture_output=True)


@pytest.mark.timeout(120)
def test_the_cli_on_a_read_only_project_names_the_file_and_the_errno_never_a_temp_file_or_errno_number(
        tmp_path, read_only_pi):
    """`castor loadout NAME` on a read-only project said ``[Errno 30] Read-only file system:
    '/abs/.../.pi/.pi-materia.json.PID.TAG.tmp'``: Python's text, the atomic write's scaffolding.
    It names the file the user knows, relative to the project, and the errno's name."""
    def castor(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(castor_argv(*argv), cwd=read_only_pi, env=serve_env(tmp_path), capture_output=True,
                              text=True, timeout=60)

    done = castor("loadout", "Full-Auto")
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("castor: storage_unavailable: "), done.stderr
    assert ".pi/pi-materia.json" in line and "EROFS" in line, line
    assert line.endswith("cannot save the active loadout on .pi/pi-materia.json (EROFS: Read-only file system)"), line
    assert "[Errno" not in line and ".tmp" not in line and str(tmp_path) not in line, line
    assert json.loads((read_only_pi / ".pi" / "pi-materia.json").read_text()) == {"activeLoadout": "Planning-Consult"}
    # A start: the same kind of line, naming where it could not write.
    script = tmp_path / "answers.json"
    script.write_text('{"answers": []}')
    done = castor("cast", "--agent", f"script:{script}", "a request")
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and line.startswith("castor: storage_unavailable: "), done.stderr
    assert "EROFS" in line and "[Errno" not in line, line
    # what could not be made, and where (it said "cannot run materia start on .pi")
    assert line.endswith("cannot create the cast's run directory in .pi/pi-materia "
                         "(EROFS: Read-only file system)"), line


@pytest.mark.timeout(30)
def test_an_os_error_line_names_the_file_relative_to_the_project_and_the_errno_name(tmp_path):
    from castor.cli.common import os_error_text

    target = tmp_path / ".pi" / ".settings.json.4242.9085c2e47.tmp"
    text = os_error_text(OSError(errno.EROFS, "Read-only file system", str(target)), cwd=str(tmp_path))
    assert text == ".pi/settings.json: Read-only file system (EROFS)"
    outside = os_error_text(OSError(errno.ENOSPC, "No space left on device", "/elsewhere/x"), cwd=str(tmp_path))
    assert outside == "/elsewhere/x: No space left on device (ENOSPC)"
    assert os_error_text(OSError(errno.EIO, "Input/output error")) == "Input/output error (EIO)"
    assert fs.shown_target("/p/.state.json.1.ab.tmp") == "/p/state.json"
    assert fs.shown_target("/p/.hidden.tmp") == "/p/.hidden.tmp"  # not an atomic write's name


@pytest.mark.timeout(120)
def test_castor_serve_whose_stderr_is_on_a_full_disk_keeps_serving(tmp_path):
    """`castor serve … 2>>LOG` with LOG's disk full: printing the serving line raised ENOSPC, so the
    server exited 1 before it served anyone (its error line could not be printed either, nor the
    traceback of that). stderr is where castor reports, not what it serves: a line that cannot be
    written is dropped. (/dev/full: every write is ENOSPC.)"""
    project = tmp_path / "project"
    project.mkdir()
    path = str(tmp_path / "castor.sock")
    with open("/dev/full", "wb") as full:
        proc = subprocess.Popen(castor_argv("--log-level", "DEBUG", "serve", "--socket", path), env=serve_env(tmp_path),
                                cwd=str(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=full)
    try:
        wait_for(lambda: os.path.exists(path) or proc.poll() is not None, timeout=30, what="the socket")
        assert proc.poll() is None, f"castor serve exited {proc.returncode}"
        server = SocketServer.__new__(SocketServer)  # the client side only
        server.path = path
        harness = Harness(server, "s1", project)
        assert harness.run_cast()["status"] == "complete"
        assert proc.poll() is None
    finally:
        proc.terminate()
        returncode = proc.wait(30)
    assert returncode in (0, -15, 143), returncode


@pytest.mark.timeout(120)
def test_a_project_made_read_only_mid_cast_stops_the_cast_resumable_and_recast_completes_it(tmp_path):
    """A real read-only mount over the project's ``.pi`` while a CLI cast waits for its first answer
    (root only: a bind mount remounted read-only, which new opens meet at once): the command ends with
    a ``storage_unavailable`` notice naming EROFS and the recast command, nothing is lost or listed
    unreadable, and once the mount is gone ``castor recast`` completes the cast."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root")
    project = tmp_path / "project"
    pi = project / ".pi"
    pi.mkdir(parents=True)
    (pi / "pi-materia.json").write_text(json.dumps({"activeLoadout": "hello"}))
    script = tmp_path / "answers.json"
    script.write_text(json.dumps([{"text": "one", "delay_ms": 1500}, "two", "three"]))
    env = serve_env(tmp_path)
    proc = subprocess.Popen(castor_argv("cast", "go", "--agent", f"script:{script}", "--quiet"), cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mounted = False
    try:
        cast_id = proc.stdout.readline().split()[1]  # type: ignore[union-attr]
        contexts = pi / "pi-materia" / cast_id / "contexts"
        wait_for(lambda: contexts.is_dir() and any(contexts.iterdir()), timeout=30, what="the first turn")
        for argv in (["mount", "--bind", str(pi), str(pi)], ["mount", "-o", "remount,bind,ro", str(pi)]):
            done = subprocess.run(argv, capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"cannot remount read-only here: {done.stderr.decode(errors='replace').strip()}")
            mounted = True
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        if mounted:
            subprocess.run(["umount", "-l", str(pi)], capture_output=True)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "internal" not in err and "crashed" not in err, err
    assert "EROFS" in err and f"castor recast {cast_id}" in err, err
    rows = _casts_json(project, tmp_path)
    assert [r["status"] for r in rows] == ["orphaned"] and rows[0]["resumable"] is True, rows
    done = subprocess.run(castor_argv("recast", cast_id, "--agent", f"script:{script}", "--quiet"), cwd=project,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in _casts_json(project, tmp_path)] == ["complete"]


def test_castor_status_names_a_state_it_cannot_read_relative_to_the_project(tmp_path, monkeypatch, capsys):
    """``castor status`` of a cast whose ``state.json`` the disk cannot give back (``EIO``; ``EACCES``
    for a user who may not read it) named the file by its absolute path; every other storage
    error names a file of the project relative to it."""
    from castor.adapters.materia import state_store
    from castor.cli.app import main
    from tests.cli.interrupted_cast import interrupted_cast

    root, run = interrupted_cast(tmp_path)
    real = state_store._read_state_text

    def failing(path: Path) -> str:
        if path.name == "state.json":
            raise OSError(errno.EIO, "Input/output error")
        return real(path)

    monkeypatch.setattr(state_store, "_read_state_text", failing)
    monkeypatch.chdir(tmp_path)
    assert main(["status", run.name, "--cwd", str(root)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"castor: storage_unavailable: storage unavailable: cannot read on "
                   f".pi/pi-materia/{run.name}/state.json (EIO: Input/output error); once the storage is fixed, "
                   f"`castor status {run.name} --cwd {root}` again"), err
