"""castor.adapters.materia.utility_runner: real subprocesses, trees, caps, pool."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import psutil
import pytest

from castor.adapters.materia.utility_runner import (
    UtilityCommand,
    UtilityPool,
    UtilitySpawnError,
    command_failure_message,
    run_command,
    spawn,
    stderr_summary,
)
from castor.messages.errors import Cancelled, ErrorCode, MailboxFull, Timeout
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


def test_nonzero_exit_keeps_stdout_and_stderr_and_wording(tmp_path):
    code = "import sys; sys.stdout.write('partial'); sys.stderr.write('bad  thing\\n  happened'); sys.exit(7)"
    result = run_command(py(code, cwd=tmp_path))
    assert (result.exit_code, result.signal, result.ok) == (7, None, False)
    assert result.stdout == "partial" and result.stderr == "bad  thing\n  happened"
    msg = command_failure_message(result, socket_id="Socket-1", stdout_artifact="o.txt", stderr_artifact="e.txt")
    assert 'socket "Socket-1" exited with code 7' in msg
    assert "stderr: bad thing happened." in msg and "stdout: o.txt; stderr: e.txt" in msg
    assert stderr_summary("", False) == "<empty>"
    assert stderr_summary("x " * 1000, True).endswith(" (truncated)")


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
    msg = command_failure_message(result, socket_id="Socket-2", stdout_artifact="o", stderr_artifact="e")
    assert msg.startswith('Utility command timed out for socket "Socket-2" after 1500ms')


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
    msg = command_failure_message(results[0], socket_id="Socket-1", stdout_artifact="o", stderr_artifact="e")
    assert "was killed" in msg


_WAIT_FOR_GO = "import json, os, sys, time\njson.load(sys.stdin)\nd = time.time() + 30\n" \
    "while not os.path.exists(sys.argv[1]) and time.time() < d:\n    time.sleep(0.01)\nprint('done')"


@pytest.mark.timeout(60)
def test_pool_bound_respected_under_20_concurrent_submissions(tmp_path):
    go = tmp_path / "go"
    pool = UtilityPool(3, max_queue=50)
    lock = threading.Lock()
    started: list = []
    max_live = [0]
    three = threading.Event()

    def on_start(handle):
        with lock:
            live = sum(1 for h in started if not h.finished) + 1
            max_live[0] = max(max_live[0], live)
            started.append(handle)
            if len(started) == 3:
                three.set()

    results = []
    cmd = py(_WAIT_FOR_GO, str(go), cwd=tmp_path, stdin={"n": 1})
    threads = [threading.Thread(target=lambda: results.append(pool.run(cmd, on_start=on_start))) for _ in range(20)]
    for t in threads:
        t.start()
    assert three.wait(20)
    assert poll_until(lambda: pool.stats().waiting == 17, timeout=10.0)
    stats = pool.stats()
    assert (stats.running, stats.waiting) == (3, 17)
    with lock:
        assert len(started) == 3  # nobody got past the gate while three run
    assert len(pool.running()) == 3
    go.touch()
    for t in threads:
        t.join(30)
    assert len(results) == 20 and all(r.ok and r.stdout == "done\n" for r in results)
    assert max_live[0] == 3
    assert pool.stats().running == 0 and pool.stats().waiting == 0


@pytest.mark.timeout(30)
def test_pool_queue_limit_timeout_and_close(tmp_path):
    go = tmp_path / "go"
    pool = UtilityPool(1, max_queue=1)
    running = threading.Event()
    outcomes: list = []

    def submit(**kw):
        try:
            outcomes.append(pool.run(py(_WAIT_FOR_GO, str(go), cwd=tmp_path), **kw))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes.append(exc)

    first = threading.Thread(target=submit, kwargs={"on_start": lambda h: running.set()})
    first.start()
    assert running.wait(10)
    second = threading.Thread(target=submit)
    second.start()
    assert poll_until(lambda: pool.stats().waiting == 1, timeout=10.0)
    with pytest.raises(MailboxFull) as info:
        pool.run(py("pass", cwd=tmp_path))
    assert info.value.may_have_started is False
    # The queue is full, so a timed wait is refused too; free a queue place first.
    pool.close()  # cancels the waiter and kills the runner
    first.join(15)
    second.join(15)
    kinds = sorted(type(o).__name__ for o in outcomes)
    assert kinds == ["Cancelled", "UtilityResult"]
    killed = next(o for o in outcomes if not isinstance(o, Exception))
    assert killed.killed
    with pytest.raises(Cancelled):
        pool.run(py("pass", cwd=tmp_path))


@pytest.mark.timeout(30)
def test_pool_queue_wait_deadline(tmp_path):
    go = tmp_path / "go"
    pool = UtilityPool(1, max_queue=5)
    running = threading.Event()
    holder = threading.Thread(
        target=lambda: pool.run(py(_WAIT_FOR_GO, str(go), cwd=tmp_path), on_start=lambda h: running.set())
    )
    holder.start()
    assert running.wait(10)
    with pytest.raises(Timeout) as info:
        pool.run(py("pass", cwd=tmp_path), queue_timeout_s=0.2)
    assert info.value.may_have_started is False
    assert pool.stats().waiting == 0
    go.touch()
    holder.join(15)
    assert pool.stats().running == 0


def test_pool_releases_the_slot_when_spawn_fails(tmp_path):
    pool = UtilityPool(1, max_queue=0)
    for _ in range(3):
        with pytest.raises(UtilitySpawnError):
            pool.run(UtilityCommand(argv=[str(tmp_path / "missing-binary")], cwd=tmp_path))
    assert pool.stats().running == 0
    assert pool.run(py("print('ok')", cwd=tmp_path)).stdout == "ok\n"
