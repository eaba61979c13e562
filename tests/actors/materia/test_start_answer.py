"""A cast's start is answered once its first state is durable: the cast is then on disk and
findable, and its first transition's effects (the files, the first visit) run on the cast's own
loop thread, before anything else asked of the cast is answered. A start with something to tell
the user performs it before answering, as before."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from castor.actors.materia.api import materia_call
from castor.adapters.materia.artifacts import CastArtifacts
from tests.support.waiting import wait_for

from .helpers import event_types, open_session, wait_status, write_project_config
from .test_config_warnings import GUARDED_TEXT


@pytest.fixture
def transition_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread that performs each transition's file effects, in order."""
    seen: list[int] = []
    real = CastArtifacts.write_transition

    def spy(self: CastArtifacts, *args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CastArtifacts, "write_transition", spy)
    return seen


@pytest.mark.timeout(60)
def test_a_start_is_answered_once_saved_and_its_first_effects_run_on_the_cast_s_thread(
        runtime_factory, project: Path, transition_threads: list[int]) -> None:
    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id, run_dir = started["cast_id"], Path(started["run_dir"])
    assert started["status"] == "active" and started["live"] is True, started
    assert (run_dir / "state.json").is_file()  # durable when the answer arrives
    assert cast_id in [row["cast_id"] for row in materia_call(rt, "s1", "list", {})["casts"]]  # and findable
    # A status is answered after the start's effects: the first transition's events are on disk by then.
    materia_call(rt, "s1", "status", {"cast_id": cast_id})
    assert "cast_start" in event_types(run_dir)
    assert transition_threads and transition_threads[0] != threading.get_ident(), \
        "the start's files were written on the starter's thread"
    assert wait_status(rt, "s1", cast_id)["status"] == "complete"


@pytest.mark.timeout(60)
def test_a_start_that_tells_the_user_something_tells_it_before_answering(
        runtime_factory, project: Path, transition_threads: list[int]) -> None:
    write_project_config(project, GUARDED_TEXT)
    rt = runtime_factory()
    _agent, ui = open_session(rt, "s1", project, ["text, not json"])
    started = materia_call(rt, "s1", "start", {"request": "go"})
    assert started["level"] == "warning"
    assert any("text-socket-guarded-edge" in message for _level, message in ui.notifications), ui.notifications
    assert transition_threads[0] == threading.get_ident()  # performed here, as before
    assert wait_status(rt, "s1", started["cast_id"])["status"] == "complete"


@pytest.mark.timeout(60)
def test_a_start_makes_its_run_directory_s_subdirectories_on_the_cast_s_thread(
        runtime_factory, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sockets/`` and ``contexts/`` (and the fsync that makes them durable) go with the first
    files, after the answer; a crash before them is replayed from the saved outbox, which makes
    them first."""
    made: list[int] = []
    real = CastArtifacts.create

    def spy(self: CastArtifacts) -> CastArtifacts:
        made.append(threading.get_ident())
        return real(self)

    monkeypatch.setattr(CastArtifacts, "create", spy)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]})  # answered after the start's effects
    assert made and threading.get_ident() not in made, "the subdirectories were made on the starter's thread"
    assert (Path(started["run_dir"]) / "contexts").is_dir() and (Path(started["run_dir"]) / "sockets").is_dir()
    assert wait_status(rt, "s1", started["cast_id"])["status"] == "complete"


@pytest.mark.timeout(60)
def test_a_start_writes_its_index_row_on_the_cast_s_thread(
        runtime_factory, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new cast's index row (one SQLite transaction) is written after the answer, on the cast's
    thread; the cast is findable meanwhile (a listing reconciles the root's changed signature), and
    once the row is in, the stored signature is the root's again: the next listing rescans nothing."""
    from castor.adapters.materia import cast_index

    inserted: list[tuple[str, int]] = []
    real = cast_index.CastIndex.moved

    def spy(self: cast_index.CastIndex, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("insert") is not None:
            inserted.append((kwargs["insert"].cast_id, threading.get_ident()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cast_index.CastIndex, "moved", spy)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"])
    first = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    wait_status(rt, "s1", first["cast_id"])
    assert [row["cast_id"] for row in materia_call(rt, "s1", "list", {})["casts"]] == [first["cast_id"]]
    inserted.clear()  # the index now stores the root's signature (a listing's reconcile)
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    cast_id = started["cast_id"]
    materia_call(rt, "s1", "status", {"cast_id": cast_id})  # answered after the cast's first message
    assert [cid for cid, _ in inserted] == [cast_id]
    assert inserted[0][1] != threading.get_ident(), "the index row was written on the starter's thread"
    root = str(Path(started["run_dir"]).parent)
    index = cast_index.open_index(root)
    assert index is not None and index.root_signature_stored() == cast_index.root_signature(root)
    assert cast_id in index.ids()
    assert wait_status(rt, "s1", cast_id)["status"] == "complete"
    assert cast_id in [row["cast_id"] for row in materia_call(rt, "s1", "list", {})["casts"]]


@pytest.mark.timeout(60)
def test_a_start_s_abort_watch_begins_on_the_cast_s_thread_and_an_early_request_is_applied(
        runtime_factory, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch for ``castor abort ID`` starts with the first transition's effects, after the
    answer; a request left before it starts (since the cast was taken) is still applied."""
    import json
    import time

    from castor.adapters.materia import abort_requests
    from castor.adapters.materia.storage import FileCastStorage
    from castor.adapters.stderr_ui import StderrUi
    from castor.runtime import HarnessLink, SessionInfo

    from .test_faults import _HeldAgent

    watched: list[int] = []
    real = FileCastStorage.watch_abort_requests

    def spy(self: FileCastStorage, *args: Any, **kwargs: Any) -> Any:
        watched.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FileCastStorage, "watch_abort_requests", spy)
    rt = runtime_factory()
    agent = _HeldAgent()
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                    HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lambda _line: None)))
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    # castor abort's request, left before the cast's thread watches (its time: after the cast was taken)
    (Path(started["run_dir"]) / abort_requests.ABORT_REQUEST).write_text(json.dumps({"requested_at": time.time()}))
    agent.next_turn()  # the first visit is sent: the cast's first message ran
    assert watched and threading.get_ident() not in watched, "the abort watch began on the starter's thread"
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "aborted", view


@pytest.mark.timeout(60)
def test_a_start_s_run_directory_is_private_from_its_mkdir_and_not_looked_at_again_for_its_mode(
        runtime_factory, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run directory a start allocates is made ``0700`` by its ``mkdir`` (a umask only narrows
    it), so taking its lease does not open it again to tighten its mode; a lease on a directory
    castor did not just make still does (``tests/security/test_old_run_dirs_made_private.py``)."""
    from castor.adapters.materia import cast_lease

    looked: list[str] = []
    real = cast_lease.keep_run_dir_private
    monkeypatch.setattr(cast_lease, "keep_run_dir_private", lambda run_dir: (looked.append(run_dir), real(run_dir)))
    old_umask = os.umask(0o022)
    try:
        rt = runtime_factory()
        open_session(rt, "s1", project, ["hi"])
        started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    finally:
        os.umask(old_umask)
    run_dir = Path(started["run_dir"])
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert looked == [], looked
    assert wait_status(rt, "s1", started["cast_id"])["status"] == "complete"


@pytest.mark.timeout(60)
def test_a_start_s_first_files_meeting_a_removed_manifest_stop_the_cast_typed_not_leave_it_waiting(
        runtime_factory, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run directory removed while the cast's thread performs its first files (``rm -rf`` right
    after the answer): the manifest's ``NotFound`` stops the cast with a typed error, as any damaged
    run directory does, instead of ending the told message with the cast left waiting for ever."""
    from castor.messages.errors import NotFound

    real = CastArtifacts.write_transition
    calls: list[int] = []

    def removed_meanwhile(self: CastArtifacts, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise NotFound(f"manifest.json not found for cast {self.cast_id}", data={"cast_id": self.cast_id})
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CastArtifacts, "write_transition", removed_meanwhile)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["hi"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    view = wait_for(lambda: (lambda v: v if not v["live"] else None)(
        materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]})), timeout=10, what="the cast stopped")
    assert view["live"] is False and calls == [1], (view, calls)
