"""A transition's whole files staged before its save (``CastArtifacts.stage``) and renamed into place
after it (``write_transition`` with a ``Staged`` content): the same bytes, no more fsyncs than writing
them after the save, and a replay that renames only what castor staged."""

from __future__ import annotations

import os

import pytest

from castor.adapters import fs
from castor.adapters.materia.artifacts import STAGED_PREFIX, CastArtifacts, Staged
from castor.ports.cast_storage import StateCorrupt

pytestmark = pytest.mark.timeout(30)

CAST = "20261207-000000-aaaa"
FILES = {"usage.json": '{\n  "turns": ["✓ \\"q\\""]\n}', "sockets/S/1.md": "the answer ✓\n",
         "contexts/S-1.md": "# context\n" * 40}


def _staged_left(run: CastArtifacts) -> list[str]:
    return sorted(name for name in os.listdir(run.run_dir) if name.startswith(STAGED_PREFIX))


def _counting_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    return calls


def test_staged_files_renamed_into_place_are_the_same_bytes_with_no_more_fsyncs(tmp_path, monkeypatch) -> None:
    plain = CastArtifacts(tmp_path / "plain", CAST).create()
    staged = CastArtifacts(tmp_path / "staged", CAST).create()
    for run in (plain, staged):  # the socket's directory made before: both count the same writes
        run.write_transition({"sockets/S/0.md": "x"}, [], [])
    fsyncs = _counting_fsyncs(monkeypatch)
    plain.write_transition(dict(FILES), [], [("socket_complete", {"socket": "S"}, 5)])
    plain_fsyncs = len(fsyncs)
    fsyncs.clear()
    files = {relative: staged.stage(text) for relative, text in FILES.items()}
    assert all(isinstance(file, Staged) and file.size == len(FILES[relative].encode())
               for relative, file in files.items())
    assert sorted(file.name for file in files.values()) == _staged_left(staged)  # in the run directory
    assert len(fsyncs) == len(FILES)  # each staged file's bytes are durable before the save
    staged.write_transition(files, [], [("socket_complete", {"socket": "S"}, 5)])
    assert len(fsyncs) == plain_fsyncs
    for relative in FILES:
        assert (staged.run_dir / relative).read_bytes() == (plain.run_dir / relative).read_bytes()
    assert _staged_left(staged) == []


def test_a_replay_renames_a_staged_file_left_and_finds_one_renamed_done(tmp_path) -> None:
    run = CastArtifacts(tmp_path, CAST).create()
    left = run.stage(FILES["sockets/S/1.md"])
    assert run.replay_staged("sockets/S/1.md", left.name, left.size) is True  # renamed now
    assert (run.run_dir / "sockets" / "S" / "1.md").read_text(encoding="utf-8") == FILES["sockets/S/1.md"]
    assert _staged_left(run) == []
    assert run.replay_staged("sockets/S/1.md", left.name, left.size) is True  # again: done already
    (run.run_dir / "sockets" / "S" / "1.md").write_text("changed since, by hand")
    assert run.replay_staged("sockets/S/1.md", left.name, left.size) is False  # left as it is
    assert (run.run_dir / "sockets" / "S" / "1.md").read_text() == "changed since, by hand"
    assert run.replay_staged("sockets/S/2.md", left.name, left.size) is False  # never written


@pytest.mark.parametrize("name", ["../state.json", ".state.json", "state.json", f"{STAGED_PREFIX}1.ab/../../x",
                                  f"{STAGED_PREFIX}x", None, 7])
def test_a_replay_renames_nothing_but_a_staged_file(tmp_path, name) -> None:
    run = CastArtifacts(tmp_path, CAST).create()
    (run.run_dir / "state.json").write_text("the state")
    with pytest.raises(StateCorrupt):
        run.replay_staged("usage.json", name, 9)  # type: ignore[arg-type]
    assert (run.run_dir / "state.json").read_text() == "the state"
    assert not (run.run_dir / "usage.json").exists()


def test_discarding_staged_files_removes_those_and_nothing_else(tmp_path) -> None:
    run = CastArtifacts(tmp_path, CAST).create()
    (run.run_dir / "usage.json").write_text("{}")
    (run.run_dir / ".usage.json.1.ab1.tmp").write_text("an atomic write's")
    first, second = run.stage("one"), run.stage(b"two")
    run.discard_staged([first.name])
    assert _staged_left(run) == [second.name]
    run.discard_staged()
    assert _staged_left(run) == []
    assert sorted(os.listdir(run.run_dir)) == [".usage.json.1.ab1.tmp", "contexts", "sockets", "usage.json"]


def test_a_stage_that_fails_leaves_nothing(tmp_path, monkeypatch) -> None:
    run = CastArtifacts(tmp_path, CAST).create()

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs, "_write_all", full)  # the disk fills up as the bytes are written
    with pytest.raises(OSError):
        run.stage("x" * 100)
    assert _staged_left(run) == []
