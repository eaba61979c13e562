"""castor.adapters.materia.process_runner: real subprocesses, trees, caps (the runtime's bounded pool is
tested in tests/actors/materia/test_utilities.py)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import psutil
import pytest

from castor.adapters.materia.process_runner import (
    UtilityCommand,
    UtilitySpawnError,
    run_command,
    spawn,
)
from castor.messages.errors import ErrorCode
from tests.support.processes import process_gone
from tests.support.waiting import poll_until

PY = sys.executable


def py(code: str, *args: str, cwd: Path, **kw) -> UtilityCommand:
    return UtilityCommand(argv=[PY, "-c", code, *args], cwd=cwd, **kw)


def test_stdin_json_and_cwd(tmp_path):
    code = "import sys, json, os; d = json.load(sys.stdin); print(json.dumps({'got': d, 'cwd': os.getcwd()}))"
    payload = {"castId": "c1", "socketId": "Socket-1", "state": {}, "item": None, "text": "héllo"}
    result = run_command(py(code, cwd=tmp_path, stdin=payload))
    assert result.ok and result.exit_code == 0 and not result.timed_out
    out = json.loads(result.stdout)
    assert out == {"got": payload, "cwd": str(tmp_path.resolve())}
    assert result.duration_ms > 0


def test_no_shell_interpretation(tmp_path):
    hostile = ["a; touch pwned", "$(touch pwned2)", "`touch pwned3`", "*", "| cat", "> out.txt", "$HOME"]
    result = run_command(py("import sys, json; print(json.dumps(sys.argv[1:]))", *hostile, cwd=tmp_path))
    assert json.loads(result.stdout) == hostile
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_nonzero_exit_keeps_stdout_and_stderr(tmp_path):
    code = "import sys; sys.stdout.write('partial'); sys.stderr.write('bad  thing\\n  happened'); sys.exit(7)"
    result = run_command(py(code, cwd=tmp_path))
    assert (result.exit_code, result.signal, result.ok) == (7, None, False)
    assert result.stdout == "partial" and result.stderr == "bad  thing\n  happened"


def test_output_caps_on_both_streams(tmp_path):
    code = "import sys; sys.stdout.write('a' * (1048576 + 100)); sys.stderr.write('e' * 5000)"
    result = run_command(py(code, cwd=tmp_path))
    assert len(result.stdout) == 1048576 and result.stdout_truncated and not result.stderr_truncated
    assert result.stderr == "e" * 5000
    small = run_command(py(code, cwd=tmp_path, max_output_bytes=1000))
    assert len(small.stdout) == 1000 and len(small.stderr) == 1000
    assert small.stdout_truncated and small.stderr_truncated and small.max_bytes == 1000


def test_spawn_error_is_typed_and_nothing_runs(tmp_path):
    with pytest.raises(UtilitySpawnError) as info:
        run_command(UtilityCommand(argv=["/definitely/not/here"], cwd=tmp_path))
    assert info.value.code == ErrorCode.NOT_FOUND and info.value.may_have_started is False
    with pytest.raises(ValueError):
        UtilityCommand(argv=[], cwd=tmp_path)
    with pytest.raises(ValueError):
        UtilityCommand(argv=["a\x00b"], cwd=tmp_path)


# A root process that starts two grandchildren and records their pids:
# one stays in the group and ignores SIGTERM (needs SIGKILL), one escapes the
# group with setsid (only found by walking the tree).
_TREE = r"""
import os, subprocess, sys, signal
pidfile = sys.argv[1]
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
with open(pidfile + ".tmp", "w") as fh:
    fh.write(f"{stubborn.pid} {escaped.pid}")
os.replace(pidfile + ".tmp", pidfile)
import time; time.sleep(60)
"""


def _read_pids(pidfile: Path) -> list[int]:
    """The pids a test command wrote (waiting until it has written them)."""
    assert poll_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "", timeout=10.0), \
        "tree did not start"
    return [int(x) for x in pidfile.read_text().split()]


@pytest.mark.timeout(30)
def test_timeout_kills_the_whole_tree_including_grandchildren(tmp_path):
    pidfile = tmp_path / "pids"
    handle = spawn(py(_TREE, str(pidfile), cwd=tmp_path, timeout_ms=1500, grace_ms=300))
    grandchildren = _read_pids(pidfile)
    assert all(psutil.pid_exists(p) for p in grandchildren)
    assert set(grandchildren) <= set(handle.pids()) and handle.pids()[0] == handle.pid
    result = handle.wait()
    assert result.timed_out and not result.killed and not result.ok
    assert result.signal is not None  # the root was signalled
    for pid in grandchildren:
        assert process_gone(pid), f"grandchild {pid} survived"
    assert handle.pids() == []
    assert result.timeout_ms == 1500


_ORPHAN = r"""
import subprocess, sys
# The grandchild inherits stdout and outlives its parent: the pipe stays open.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
print("parent done", flush=True)
"""


@pytest.mark.timeout(30)
def test_orphaned_grandchild_holding_the_pipe_is_killed_at_the_deadline(tmp_path):
    pidfile = tmp_path / "pid"
    handle = spawn(py(_ORPHAN, str(pidfile), cwd=tmp_path, timeout_ms=1500, grace_ms=200))
    (grandchild,) = _read_pids(pidfile)
    result = handle.wait()
    assert result.timed_out and result.exit_code == 0  # the root itself exited cleanly
    assert result.stdout == "parent done\n"
    assert process_gone(grandchild)


_ESCAPED = r"""
import subprocess, sys
# The grandchild leaves the process group (its own session) *after* its parent has exited,
# ignores SIGTERM and keeps stdout open: only the pipe it holds still ties it to the command.
code = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(0.5); "
        "os.setsid(); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)")
subprocess.Popen([sys.executable, "-c", code, sys.argv[1]])
"""


@pytest.mark.timeout(30)
def test_a_grandchild_that_left_the_group_after_its_parent_died_is_killed_by_the_pipe_it_holds(tmp_path):
    pidfile = tmp_path / "pid"
    handle = spawn(py(_ESCAPED, str(pidfile), cwd=tmp_path, timeout_ms=2000, grace_ms=200))
    (escaped,) = _read_pids(pidfile)
    result = handle.wait()
    assert result.timed_out
    assert poll_until(lambda: process_gone(escaped), timeout=5.0), "the escaped grandchild survived"


@pytest.mark.timeout(30)
def test_kill_from_another_thread(tmp_path):
    pidfile = tmp_path / "pids"
    handles = []
    started = threading.Event()

    def on_start(h):
        handles.append(h)
        started.set()

    results = []
    runner = threading.Thread(
        target=lambda: results.append(run_command(py(_TREE, str(pidfile), cwd=tmp_path), on_start=on_start))
    )
    runner.start()
    assert started.wait(10)
    grandchildren = _read_pids(pidfile)
    handles[0].kill()
    runner.join(15)
    assert results and results[0].killed and not results[0].timed_out
    assert results[0].signal_name == "SIGKILL"
    assert all(process_gone(p) for p in grandchildren)


def test_a_reaped_command_s_pid_taken_by_another_process_is_not_searched_for_its_tree(tmp_path):
    """Once the command's root is reaped the system may give its pid to an unrelated process (pids
    wrap at 32,768 on many hosts). Its tree is then not looked up by that pid: the stranger's
    children are never taken for the command's (and so never signalled). The reuse is staged: the
    finished command's pid is pointed at an innocent session leader's."""
    import os
    import signal
    import subprocess

    handle = spawn(py("print('done')", cwd=tmp_path))
    assert handle.wait().ok
    innocent = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        assert poll_until(lambda: psutil.Process(innocent.pid).children(), timeout=10)
        child = psutil.Process(innocent.pid).children()[0]
        handle.pid = innocent.pid  # the reaped root's pid is the innocent's now
        assert child.pid not in {p.pid for p in handle._descendants()}
        handle._terminate_tree(0.2)  # what a late terminate would do with the tree it finds
        assert innocent.poll() is None and child.is_running()
    finally:
        os.killpg(innocent.pid, signal.SIGKILL)
        innocent.wait(10)


@pytest.mark.timeout(30)
def test_two_gentle_stops_at_once_end_the_tree_once_and_say_so_once(tmp_path):
    """A cast that stops asks its command to end gently, each ask on a thread of its own, and a cast
    and its runtime stopping together ask twice: the tree is SIGTERMed, then SIGKILLed after the
    grace, once -- the operator's log said "survived SIGTERM grace; sending SIGKILL" once for each
    ask (and signalled the tree twice)."""
    from loguru import logger

    said: list[str] = []
    sink = logger.add(lambda message: said.append(message.record["message"]), level="WARNING",
                      filter=lambda record: record["extra"].get("utility_pid") is not None)
    logger.enable("castor")
    try:
        ready = tmp_path / "ready"
        code = (f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"open({str(ready)!r}, 'w').close(); time.sleep(60)")
        handle = spawn(py(code, cwd=tmp_path, timeout_ms=60000))
        assert poll_until(ready.exists, timeout=10)
        stops = [threading.Thread(target=handle.terminate, args=(0.5,)) for _ in range(2)]
        for stop in stops:
            stop.start()
        result = handle.wait()
        for stop in stops:
            stop.join(10)
        assert result.killed and result.signal_name == "SIGKILL"
        assert said.count("utility tree survived SIGTERM grace; sending SIGKILL") == 1, said
    finally:
        logger.remove(sink)  # castor's logging stays on, as the suite's conftest turned it on for every test
