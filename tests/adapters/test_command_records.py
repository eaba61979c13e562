"""castor.adapters.materia.command_records: what a dead runtime left running, found and killed."""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest

from castor.adapters.materia import command_records
from tests.support.processes import process_gone
from tests.support.waiting import poll_until


def _group_of_two() -> tuple[subprocess.Popen[bytes], int]:
    """A session leader with a child in its group (as castor starts a utility command)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE,
                              start_new_session=True)
    child = int(leader.stdout.readline())
    return leader, child


@pytest.mark.timeout(30)
def test_a_recorded_group_is_killed_with_its_members_and_the_record_removed(tmp_path):
    leader, child = _group_of_two()
    try:
        path = command_records.record_path(tmp_path, "cast:Socket-1:1:1")
        command_records.record_running(path, "cast:Socket-1:1:1", leader.pid, "sh")
        assert path.parent.name == ".commands" and ":" not in path.name
        killed = command_records.kill_recorded(tmp_path)
        assert set(killed) == {leader.pid, child}
        leader.wait(10)
        assert poll_until(lambda: process_gone(child), timeout=10)
        assert not path.exists()
    finally:
        for pid in (leader.pid, child):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        leader.wait(10)


@pytest.mark.timeout(30)
def test_a_pid_reused_by_another_process_is_never_killed(tmp_path):
    """The leader's pid alive but created at another time: not the recorded command."""
    leader, child = _group_of_two()
    try:
        path = command_records.record_path(tmp_path, "v")
        command_records.record_running(path, "v", leader.pid, "sh")
        record = json.loads(path.read_text())
        record["create_time"] -= 100.0  # as if the recorded command had been another process
        path.write_text(json.dumps(record))
        assert command_records.kill_recorded(tmp_path) == []
        assert not process_gone(leader.pid) and not process_gone(child)
        assert not path.exists()  # a record that names nobody is dropped
    finally:
        for pid in (child, leader.pid):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        leader.wait(10)


def test_unreadable_records_are_dropped_without_killing_anything(tmp_path):
    directory = tmp_path / command_records.RECORDS_DIR
    directory.mkdir()
    (directory / "bad.json").write_text("{not json")
    (directory / "odd.json").write_text(json.dumps({"pid": "x"}))
    assert command_records.kill_recorded(tmp_path) == []
    assert list(directory.iterdir()) == []
