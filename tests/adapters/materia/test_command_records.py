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
