"""A transition's whole files are staged before its save: the saved outbox names each staged file (and
its size) instead of holding its text, and performing the write renames it into place. A crash
between the save and the renames is replayed to the same bytes; staged files nothing saved names
(a crash between staging and the save, a failed save) are removed; a state saved by a castor that
embedded the text (the fixture next to this file) still loads and replays."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from castor.actors.materia.api import materia_call
from castor.actors.materia.cast_actor import STAGED_KEY, CastActor
from castor.adapters.materia.artifacts import STAGED_PREFIX
from castor.supervision import faults

from .helpers import event_types, open_session, wait_for, wait_status

pytestmark = pytest.mark.timeout(60)

FIXTURE = Path(__file__).parent / "fixtures" / "embedded_outbox_state.json"


def _staged_left(run_dir: Path) -> list[str]:
    return sorted(name for name in os.listdir(run_dir) if name.startswith(STAGED_PREFIX))


def _cast_handle(rt, sid, cast_id):
    return rt.system.lookup(f"/root/session/{sid}/cast/{cast_id}")


def test_a_crash_after_the_save_replays_the_staged_files_to_the_same_bytes(runtime_factory, project,
                                                                          monkeypatch) -> None:
    caught: dict[str, object] = {}
    real = CastActor._perform_files

    def perform_files(self, files):
        if self._staged and "outbox" not in caught:  # the first staged transition: saved, not performed
            run_dir = Path(self.artifacts.run_dir)
            document = json.loads((run_dir / "state.json").read_text(encoding="utf-8"))
            caught["outbox"] = document["state"]["outbox"]
            caught["staged"] = {name: (run_dir / name).read_bytes() for name in _staged_left(run_dir)}
            caught["events"] = event_types(run_dir)
            raise RuntimeError("as if killed between the save and the transition's effects")
        return real(self, files)

    monkeypatch.setattr(CastActor, "_perform_files", perform_files)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["the answer ✓ \"quoted\" \\ \u2028"] * 4)
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete"
    run_dir = Path(started["run_dir"])
    writes = [entry for entry in caught["outbox"] if entry["kind"] == "write_artifact"]
    assert writes and all("content" not in entry and STAGED_KEY in entry for entry in writes), writes
    staged = caught["staged"]
    assert sorted(entry[STAGED_KEY] for entry in writes) == sorted(staged)  # each named, each staged
    for entry in writes:  # the restart's replay renamed each staged file into place: the same bytes
        written = (run_dir / "/".join(entry["path"])).read_bytes()
        assert written == staged[entry[STAGED_KEY]] and len(written) == entry["size"]
    assert b"the answer" in b"".join(staged.values())
    assert _staged_left(run_dir) == []
    types = event_types(run_dir)
    assert types.count("cast_end") == 1 and types[:len(caught["events"])] == caught["events"]  # once each


def test_a_staged_file_no_saved_state_names_is_removed_at_the_next_load(runtime_factory, project) -> None:
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, [{"text": "never", "delay_ms": 5000}, "resumed"])
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    wait_for(lambda: agent.in_flight(), what="the first turn")
    run_dir = Path(started["run_dir"])
    orphan = run_dir / f"{STAGED_PREFIX}12345.abcdef01"  # staged, and the runtime died before the save
    orphan.write_text("a transition that was never saved")
    faults.kill(_cast_handle(rt, "s1", started["cast_id"]))
    assert wait_status(rt, "s1", started["cast_id"])["status"] == "complete"
    assert not orphan.exists()
    assert _staged_left(run_dir) == []


def test_a_save_that_fails_leaves_no_staged_file(runtime_factory, project, monkeypatch) -> None:
    from castor.adapters.materia.state_store import CastStateStore

    real = CastStateStore.save_encoded
    failed: list[int] = []

    def save_encoded(self, cast_id, state_json, **kwargs):
        if not failed and b'"staged":"' in b"".join(bytes(piece) for piece in state_json):
            failed.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, cast_id, state_json, **kwargs)

    monkeypatch.setattr(CastStateStore, "save_encoded", save_encoded)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["the answer"] * 4)
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    view = wait_status(rt, "s1", started["cast_id"], statuses=("failed", "orphaned"))
    assert failed and view["resumable"] is True
    assert _staged_left(Path(started["run_dir"])) == []


def test_a_state_saved_with_its_files_text_in_the_outbox_still_loads_and_replays(runtime_factory,
                                                                                 project) -> None:
    # The fixture is the state.json of a hello cast as castor saved it before files were staged: its
    # last transition (the agent's answer) saved with usage.json's and the socket output's text in its
    # outbox, and killed before any of its effects. Its run directory is rebuilt here as it was then.
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    cast_id = document["castId"]
    outbox = document["state"]["outbox"]
    writes = {"/".join(entry["path"]): entry["content"] for entry in outbox if entry["kind"] == "write_artifact"}
    assert set(writes) == {"usage.json", "sockets/Socket-1/1.md"} and not any(
        STAGED_KEY in entry for entry in outbox)
    rt = runtime_factory()
    open_session(rt, "s1", project, ["not asked"])
    run_dir = project / ".pi" / "pi-materia" / cast_id  # the default artifactDir, as the fixture's was
    run_dir.parent.mkdir(parents=True)
    shutil.copytree(FIXTURE.parent / "embedded_outbox_run", run_dir)
    (run_dir / "state.json").write_bytes(FIXTURE.read_bytes())
    materia_call(rt, "s1", "recast", {"cast_id": cast_id})
    wait_for(lambda: "cast_end" in event_types(run_dir), what="the replayed cast_end")
    for relative, text in writes.items():
        assert (run_dir / relative).read_text(encoding="utf-8") == text
    types = event_types(run_dir)
    assert types.count("cast_start") == 1 and types.count("cast_end") == 1
    assert json.loads((run_dir / "manifest.json").read_text())["entries"][-1]["phase"] == "complete"
