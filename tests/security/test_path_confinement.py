"""Artifact path confinement: hostile ids and directories never make castor write outside its root.

Through the adapters (``CastArtifacts``, ``CastStateStore``) and through the
runtime (``materia`` ``start`` with a hostile project config). After each
attack the whole tmp tree is scanned: nothing may exist outside the root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from castor.actors.materia.api import materia_call
from castor.adapters.agents.scripted import ScriptedAgent, parse_script
from castor.adapters.materia.artifacts import CastArtifacts
from castor.adapters.materia.state_store import CastStateStore, list_casts
from castor.adapters.stderr_ui import StderrUi
from castor.composition import materia_component
from castor.messages.errors import CastorError, Forbidden
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo

from .conftest import files_under, wait_until

pytestmark = pytest.mark.timeout(30)

HOSTILE_IDS = ["..", ".", "../x", "../../etc/passwd", "/etc", "/tmp/abs", "a/b", "a\\b", "x\x00y", "",
               "a" * 200, "~", "~root", "-rf", ".hidden", "C:\\evil", "ｘ", "a\nb", " spaced"]


def _outside(tmp: Path, root: Path, before: set[Path]) -> list[Path]:
    """Files created during the attack that are not under ``root``."""
    return sorted(p for p in files_under(tmp) - before if not p.resolve().is_relative_to(root.resolve()))


def test_hostile_cast_ids_are_forbidden_by_artifacts_and_state_store_and_write_nothing(tmp_path):
    root = tmp_path / "artifacts"
    store = CastStateStore(root)
    for cast_id in HOSTILE_IDS:
        with pytest.raises(Forbidden):
            CastArtifacts(root, cast_id).create()
        with pytest.raises(Forbidden):
            store.claim(cast_id)
        with pytest.raises(Forbidden):
            store.save(cast_id, {"x": 1}, incarnation=1)
        with pytest.raises(Forbidden):
            store.load(cast_id)
    assert files_under(tmp_path) == set() and not root.exists()


def test_hostile_socket_ids_and_relative_paths_never_leave_the_run_dir(tmp_path):
    root = tmp_path / "artifacts"
    arts = CastArtifacts(root, "c-1").create()
    before = files_under(tmp_path)
    for socket_id in HOSTILE_IDS:
        writes = [
            lambda socket_id=socket_id: arts.write_socket_output(socket_id, 1, "text"),
            lambda socket_id=socket_id: arts.write_socket_json(socket_id, 1, {"a": 1}),
            lambda socket_id=socket_id: arts.write_utility_input(socket_id, 1, {"a": 1}),
            lambda socket_id=socket_id: arts.write_context(socket_id, 1, "ctx"),
            lambda socket_id=socket_id: arts.write_refinement(socket_id, 1, 1, "e1", "r"),
            lambda socket_id=socket_id: arts.write_command_result(socket_id, 1, stdout="o", stderr="e",
                                                                  stdout_truncated=False, stderr_truncated=False,
                                                                  max_bytes=10),
        ]
        for write in writes:
            with pytest.raises(Forbidden):
                write()
    for relative in ("../escape", "../../escape", "/tmp/escape-abs", "sockets/../../escape", "a/../../escape"):
        with pytest.raises(Forbidden):
            arts.write_relative(relative, "x")
    assert files_under(tmp_path) == before


def test_free_text_item_keys_entry_ids_and_suffixes_are_sanitised_into_the_run_dir(tmp_path):
    root = tmp_path / "artifacts"
    arts = CastArtifacts(root, "c-1").create()
    before = files_under(tmp_path)
    hostile = ["../../../../escaped", "/abs/olute", "..", "a/b\x00c", "\n", "x" * 5000]
    written = []
    for text in hostile:
        written.append(arts.write_socket_output("Socket-1", 1, "o", item_key=text))
        written.append(arts.write_refinement("Socket-1", 1, 2, text, "r", item_key=text))
        written.append(arts.write_context("Socket-1", 1, "c", item_key=text, suffix=text))
    new = files_under(tmp_path) - before
    assert new and _outside(tmp_path, arts.run_dir, before) == []
    assert all(p.resolve().is_relative_to(arts.run_dir) and len(p.name) < 400 for p in written)
    assert not (tmp_path / "escaped").exists() and not Path("/abs/olute").exists()


def test_a_planted_symlink_inside_the_run_dir_cannot_redirect_a_write(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "artifacts"
    arts = CastArtifacts(root, "c-1").create()
    (arts.run_dir / "sockets" / "Socket-1").symlink_to(outside, target_is_directory=True)
    (arts.run_dir / "usage.json").symlink_to(outside / "usage.json")
    with pytest.raises(Forbidden):
        arts.write_socket_output("Socket-1", 1, "through the link")
    with pytest.raises(Forbidden):
        arts.write_usage({"tokens": 1})
    store = CastStateStore(root)
    store.claim("c-2")
    state = store.state_path("c-2")
    state.unlink()
    state.symlink_to(outside / "state.json")
    with pytest.raises(Forbidden):
        store.save("c-2", {"x": 1}, incarnation=1)
    assert list(outside.iterdir()) == []



@pytest.mark.parametrize("where", ["outside", "another cast"])
def test_a_run_directory_replaced_by_a_link_while_its_cast_runs_is_never_written_through(tmp_path, where):
    """The save's fast path lstat-ed ``state.json`` only: a run directory moved away and replaced by
    a link to it (the same files, so the same signature) took every later transition -- state,
    artifacts, events -- to wherever the link led, outside the project. A link in the run
    directory's place is now refused (``forbidden``) and nothing behind it changes."""
    root = tmp_path / "artifacts"
    store = CastStateStore(root)
    store.claim("c-1")
    store.save("c-1", {"n": 1}, incarnation=1)  # the next save takes the fast path
    store.save("c-1", {"n": 2}, incarnation=1)
    run = store.state_path("c-1").parent
    if where == "outside":
        target = tmp_path / "outside" / "run"
        target.parent.mkdir()
        run.rename(target)
    else:  # a sibling cast's directory inside the same root
        store.claim("c-2")
        store.save("c-2", {"other": True}, incarnation=5)
        target = store.state_path("c-2").parent
        run.rename(tmp_path / "moved-away")
    before = (target / "state.json").read_bytes()
    run.symlink_to(target, target_is_directory=True)
    with pytest.raises(Forbidden) as refused:
        store.save("c-1", {"n": 3}, incarnation=9)
    from castor.domain.paths import REASON_SYMLINK

    assert refused.value.data["reason"] == REASON_SYMLINK, refused.value.to_wire()
    assert (target / "state.json").read_bytes() == before
    with pytest.raises(Forbidden):  # and again: the refusal is not a one-off
        store.save("c-1", {"n": 3}, incarnation=9)
    assert (target / "state.json").read_bytes() == before


def test_a_transition_batch_never_writes_through_a_planted_symlink(tmp_path):
    """write_transition checks each directory once and never follows a final component: a
    directory link leading out is refused, a linked file is replaced (the link itself, by the
    rename), a linked event log is refused — and nothing outside the run dir changes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "usage.json").write_text("victim")
    arts = CastArtifacts(tmp_path / "artifacts", "c-3").create()
    arts.init_manifest(request="r", config_source="test")
    (arts.run_dir / "sockets" / "Socket-1").symlink_to(outside, target_is_directory=True)
    with pytest.raises(Forbidden):
        arts.write_transition({"sockets/Socket-1/1.md": "through the link"}, [], [])
    (arts.run_dir / "usage.json").symlink_to(outside / "usage.json")
    arts.write_transition({"usage.json": "{}\n"}, [{"phase": "p"}], [("e", {"n": 1}, 1)])
    assert not (arts.run_dir / "usage.json").is_symlink() and (arts.run_dir / "usage.json").read_text() == "{}\n"
    (arts.run_dir / "events.jsonl").unlink()
    (arts.run_dir / "events.jsonl").symlink_to(outside / "events.jsonl")
    with pytest.raises(Forbidden):
        arts.write_transition({}, [], [("e", {"n": 2}, 2)])
    assert sorted(p.name for p in outside.iterdir()) == ["usage.json"]
    assert (outside / "usage.json").read_text() == "victim"


def test_list_casts_ignores_hostile_directory_names(tmp_path):
    root = tmp_path / "artifacts"
    CastStateStore(root).save("c-ok", {"request": "r"}, incarnation=1)
    (root / "..weird").mkdir()
    (root / "has space").mkdir()
    (root / "link-out").symlink_to(tmp_path, target_is_directory=True)
    listing = list_casts(root)
    assert [c.cast_id for c in listing.casts] == ["c-ok"]


# ---------------------------------------------------------------------------
# Through the runtime: cast start with a hostile project config

SINGLE = {"activeLoadout": "one", "loadouts": {"one": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter"}}}}}


def _start(tmp_path: Path, project: Path, config: dict, *, trusted: bool) -> tuple[Runtime, dict | CastorError]:
    (project / ".pi").mkdir(parents=True, exist_ok=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    rt = Runtime(RuntimeSettings(), components=[materia_component()])
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=trusted),
                    HarnessLink(agent=ScriptedAgent(parse_script(["hello"] * 5)), session_log=None,
                                ui=StderrUi(printer=lambda _line: None)))
    try:
        return rt, materia_call(rt, "s1", "start", {"request": "write a file"})
    except CastorError as exc:
        return rt, exc


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.parametrize("artifact_dir", ["../outside", "../../outside", "/tmp/castor-sec-abs-escape",
                                          "a/../../outside", "symlink-out", "build/../arts"])
def test_cast_start_with_a_hostile_artifact_dir_is_forbidden_and_writes_nothing_outside(
        tmp_path, artifact_dir, trusted):
    project = tmp_path / "project"
    project.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / "symlink-out").symlink_to(outside, target_is_directory=True)
    before = files_under(tmp_path)
    rt, result = _start(tmp_path, project, {**SINGLE, "artifactDir": artifact_dir}, trusted=trusted)
    try:
        assert isinstance(result, CastorError) and result.code == "forbidden", result
    finally:
        rt.shutdown(10)
    new = files_under(tmp_path) - before
    assert [p for p in new if p.name != "pi-materia.json"] == []
    assert list(outside.iterdir()) == [] and not Path("/tmp/castor-sec-abs-escape").exists()


def test_a_confined_artifact_dir_works_and_every_file_stays_inside_it(tmp_path):
    """The control: the same path through the runtime does write, inside the configured root."""
    project = tmp_path / "project"
    project.mkdir()
    before = files_under(tmp_path)
    rt, started = _start(tmp_path, project, {**SINGLE, "artifactDir": "build/./arts"}, trusted=False)
    try:
        assert isinstance(started, dict), started
        wait_until(lambda: materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]})["status"]
                   in ("complete", "failed", "aborted"), 15, "the cast to end")
    finally:
        rt.shutdown(10)
    root = project / "build" / "arts"
    new = files_under(tmp_path) - before
    assert any(p.name == "events.jsonl" for p in new)
    assert [p for p in new if p.name != "pi-materia.json" and not p.resolve().is_relative_to(root)] == []
    assert os.path.isdir(root / started["cast_id"])


def test_over_long_free_text_names_are_shortened_deterministically_inside_the_run_dir(tmp_path):
    arts = CastArtifacts(tmp_path / "artifacts", "c-1").create()
    key_a, key_b = "k" * 300 + "-a", "k" * 300 + "-b"
    first = arts.write_refinement("S" * 128, 1, 2, "e" * 500, "one", item_key=key_a)
    again = arts.write_refinement("S" * 128, 1, 2, "e" * 500, "two", item_key=key_a)
    other = arts.write_refinement("S" * 128, 1, 2, "e" * 500, "three", item_key=key_b)
    assert first == again != other  # same logical path → same file; different → different
    assert first.read_text() == "two" and other.read_text() == "three"
    assert all(len(p.name.encode()) <= 200 and p.name.endswith(".md") for p in (first, other))
    assert first.resolve().is_relative_to(arts.run_dir)


def _plan(*ids: str) -> str:
    return json.dumps({"summary": "plan", "workItems": [
        {"id": i, "title": "t", "description": "d", "acceptance": []} for i in ids]})


def _verdict(ok: bool) -> str:
    return json.dumps({"satisfied": ok, "feedback": "", "missing": []})


def test_a_model_chosen_work_item_id_of_any_length_cannot_wedge_a_cast(tmp_path):
    """Model output names files: a 300-char work item id once crash-looped the CastActor (ENAMETOOLONG)."""
    project = tmp_path / "project"
    project.mkdir()
    script = {"Socket-3": [_plan("w" * 300, "../" * 90)], "Socket-4": ["b1", "b2"],
              "Socket-5": [_verdict(True), _verdict(True)], "Socket-7": ["done"]}
    rt = Runtime(RuntimeSettings(), components=[materia_component()])
    try:
        rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                        HarnessLink(agent=ScriptedAgent(parse_script(script)), session_log=None,
                                    ui=StderrUi(printer=lambda _line: None)))
        started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "build"})
        view = wait_until(lambda: (v := materia_call(rt, "s1", "status", {"cast_id": started["cast_id"]}))
                          ["status"] in ("complete", "failed", "aborted") and v, 15, "the cast to end")
    finally:
        rt.shutdown(10)
    assert view["status"] == "complete", view
    run_dir = Path(view["run_dir"]).resolve()
    # the build loadout's project.ensureIgnored step legitimately edits the project's .gitignore
    written = [
        p for p in files_under(tmp_path) if p not in (project / ".pi" / "pi-materia.json", project / ".gitignore")
    ]
    assert written and [p for p in written if not p.resolve().is_relative_to(run_dir.parent)] == []
    assert all(len(p.name.encode()) <= 200 for p in written)
