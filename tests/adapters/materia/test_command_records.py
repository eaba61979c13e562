"""castor.adapters.materia.command_records: what a dead runtime left running, found and killed —
and nothing else, whatever a record planted in the project tree says."""

from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from castor.adapters.materia import command_records
from tests.support.processes import process_gone
from tests.support.waiting import poll_until

CAST = "2026-01-01T00-00-00-000Z"
VISIT = f"{CAST}:Socket-1:1:1"


def _command(visit: str | None, run_dir=None) -> tuple[subprocess.Popen[bytes], int]:
    """A command as castor starts one (own session; a child in the tree), tagged with ``visit``
    and ``run_dir``."""
    env = dict(os.environ)
    env.pop(command_records.VISIT_ID_ENV, None)
    if visit is not None:
        env[command_records.VISIT_ID_ENV] = visit
        env[command_records.RUN_DIR_ENV] = str(run_dir)
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, env=env,
                              start_new_session=True)
    child = int(leader.stdout.readline())
    return leader, child


def _cleanup(leader: subprocess.Popen[bytes], child: int) -> None:
    for pid in (child, leader.pid):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    leader.wait(10)


@pytest.mark.timeout(30)
def test_a_recorded_visits_processes_are_killed_and_the_record_removed(tmp_path):
    path = command_records.record_path(tmp_path, VISIT)
    assert command_records.record_running(path, VISIT)  # written before the command starts
    leader, child = _command(VISIT, tmp_path)
    try:
        assert path.parent.name == ".commands" and ":" not in path.name
        killed = command_records.kill_recorded(tmp_path, CAST)
        assert {leader.pid, child} <= set(killed)
        leader.wait(10)
        assert poll_until(lambda: process_gone(child), timeout=10)
        assert not path.exists()
    finally:
        _cleanup(leader, child)


@pytest.mark.timeout(30)
def test_a_planted_record_never_reaches_a_process_that_is_not_this_casts_command(tmp_path):
    """A record comes from the project tree: it may name a pid, a group, any visit — only a
    process whose own environment carries a visit of *this* cast is ever killed."""
    stranger, stranger_child = _command(None)
    other_cast, other_child = _command("2099-01-01T00-00-00-000Z:Socket-1:1:1", tmp_path)
    original, original_child = _command(VISIT, tmp_path / "the-original-checkout")  # this one copied
    try:
        directory = tmp_path / command_records.RECORDS_DIR
        directory.mkdir()
        (directory / "forged.json").write_text(json.dumps({"visit_id": VISIT, "pid": stranger.pid,
                                                           "pgid": stranger.pid}))
        (directory / "other.json").write_text(json.dumps({"visit_id": "2099-01-01T00-00-00-000Z:Socket-1:1:1"}))
        assert command_records.kill_recorded(tmp_path, CAST) == []
        for pid in (stranger.pid, stranger_child, other_cast.pid, other_child, original.pid, original_child):
            assert not process_gone(pid)
        assert list(directory.iterdir()) == []  # records that name nobody are dropped
    finally:
        _cleanup(stranger, stranger_child)
        _cleanup(other_cast, other_child)
        _cleanup(original, original_child)


def test_unreadable_records_are_dropped_without_killing_anything(tmp_path):
    directory = tmp_path / command_records.RECORDS_DIR
    directory.mkdir()
    (directory / "bad.json").write_text("{not json")
    (directory / "odd.json").write_text(json.dumps(["x"]))
    assert command_records.kill_recorded(tmp_path, CAST) == []
    assert list(directory.iterdir()) == []


def test_a_planted_commands_symlink_is_never_listed_written_or_emptied(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "settings.json").write_text("{}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / command_records.RECORDS_DIR).symlink_to(outside)
    assert command_records.kill_recorded(run_dir, CAST) == []
    assert not command_records.record_running(command_records.record_path(run_dir, VISIT), VISIT)
    assert [p.name for p in outside.iterdir()] == ["settings.json"]


@pytest.mark.timeout(30)
def test_a_parent_killed_after_its_child_runs_nothing_more(tmp_path, monkeypatch):
    """The victims are killed one by one, in the order they were found, and pids wrap: a child may
    be killed before its parent. A parent that outlived its child by a moment ran on (a script's
    next line after the command it waited for), so every victim is stopped before any is killed.
    Staged: the processes are found newest first (the child before its shell), and after the first
    kill the test gives the shell a whole second to run its next line."""
    marker = tmp_path / "ran-on"
    env = {**os.environ, command_records.VISIT_ID_ENV: VISIT, command_records.RUN_DIR_ENV: str(tmp_path)}
    leader = subprocess.Popen(["sh", "-c", f"sleep 300 & echo $!; wait; echo ran > {marker}"],
                              stdout=subprocess.PIPE, env=env, start_new_session=True)
    child = int(leader.stdout.readline())
    real_iter, real_kill = psutil.process_iter, psutil.Process.kill
    monkeypatch.setattr(psutil, "process_iter",
                        lambda *a, **k: sorted(real_iter(*a, **k), key=lambda p: p.pid, reverse=True))
    first: list[int] = []

    def kill_then_let_the_rest_run(proc: psutil.Process) -> None:
        real_kill(proc)
        if not first:
            first.append(proc.pid)
            poll_until(marker.exists, timeout=1.0)  # a parent still running writes it meanwhile

    monkeypatch.setattr(psutil.Process, "kill", kill_then_let_the_rest_run)
    try:
        # Matched by run directory too: another test of this file, on the other worker, tags its
        # commands with the same visit id (killing those made this one's order a race).
        killed = command_records.kill_tagged(lambda e: e.get(command_records.VISIT_ID_ENV) == VISIT
                                             and e.get(command_records.RUN_DIR_ENV) == str(tmp_path))
        assert first == [child] and set(killed) == {child, leader.pid}, (first, killed)
        assert not marker.exists(), "the shell ran its next line after its child was killed"
    finally:
        monkeypatch.undo()
        _cleanup(leader, child)


def test_an_ended_commands_outcome_is_kept_for_the_recast_and_only_for_its_own_visit(tmp_path):
    """The outcome written into a record as the command ends is what a recast takes instead of
    running the command again: read back for its own visit of this cast only, kept by
    ``kill_recorded`` when asked (every other record is removed), gone once forgotten."""
    other = f"{CAST}:Socket-2:1:2"
    path, other_path = command_records.record_path(tmp_path, VISIT), command_records.record_path(tmp_path, other)
    assert command_records.record_running(path, VISIT) and command_records.record_running(other_path, other)
    assert command_records.finished_outcome(tmp_path, CAST, VISIT) is None  # still running: no outcome
    command_records.record_outcome(path, VISIT, {"visit_id": VISIT, "stdout": "deployed", "exit_code": 0})
    assert command_records.finished_outcome(tmp_path, CAST, VISIT) == {"visit_id": VISIT, "stdout": "deployed",
                                                                       "exit_code": 0}
    assert command_records.finished_outcome(tmp_path, "another-cast", VISIT) is None  # not this cast's visit
    assert command_records.kill_recorded(tmp_path, CAST, keep=VISIT) == []
    assert path.exists() and not other_path.exists()
    command_records.forget(path)
    assert command_records.finished_outcome(tmp_path, CAST, VISIT) is None


def test_a_planted_record_with_an_outcome_for_another_visit_is_not_taken(tmp_path):
    path = command_records.record_path(tmp_path, VISIT)
    assert command_records.record_running(path, VISIT)
    path.write_text(json.dumps({"visit_id": f"{CAST}:Socket-9:1:1", "outcome": {"stdout": "x"}}))
    assert command_records.finished_outcome(tmp_path, CAST, VISIT) is None


def _fsynced_paths(monkeypatch) -> list[str]:
    """Every path ``os.fsync`` is called on from now on (its descriptor's target), in order."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_the_started_record_is_durable_as_the_state_file_is(tmp_path, monkeypatch):
    """The record that a command is running is what makes the next runtime warn that it runs the
    command again; a power cut must not take it: the record is fsynced, and so are ``.commands``
    (the record's name in it) and the run directory (``.commands`` made just now)."""
    path = command_records.record_path(tmp_path, VISIT)
    synced = _fsynced_paths(monkeypatch)
    assert command_records.record_running(path, VISIT)
    records = str(path.parent)
    assert [p for p in synced if os.path.dirname(p) == records], synced  # the record's bytes (its temp file)
    assert records in synced and str(tmp_path) in synced, synced
    assert synced.index(str(tmp_path)) < synced.index(records)  # .commands is named before the record in it
    synced.clear()
    other = command_records.record_path(tmp_path, f"{CAST}:Socket-2:1:1")
    assert command_records.record_running(other, f"{CAST}:Socket-2:1:1")
    assert synced[-1] == records, synced  # .commands already there: the record's name in it is synced
