"""The Icarus worker does not outlive the process that started it.

A castor killed with SIGKILL while a backend call hangs used to leave the worker -- and whatever
the backend had started -- running for ever (its parent gone, nobody to kill the tree). The
worker program now watches its request pipe for the hang-up, and then its parent: a parent that
closed the pipe and lives on still gets every reply; once the parent is gone, a worker still busy
kills its process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from castor.adapters.icarus.worker_program import READY_LINE
from tests.support.icarus import gone
from tests.support.waiting import wait_for

HANGING_BACKEND = textwrap.dedent("""
    import os, subprocess, sys, time

    def hang(marker):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(marker + ".tmp", "w") as out:
            out.write(f"{os.getpid()} {child.pid}")
        os.rename(marker + ".tmp", marker)
        time.sleep(300)

    def quick():
        return os.getpid()

    def slow(n):
        time.sleep(0.3)
        return n
""")

# A parent that starts a worker the way castor does (WorkerProcess: its own process group) and
# runs one call, then waits to be killed.
PARENT = textwrap.dedent("""
    import sys, time
    from castor.adapters.icarus.launch import build_launch
    from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id
    from castor.domain.icarus.settings import IcarusSettings

    backend, project, function, marker = sys.argv[1:5]
    settings = IcarusSettings(icarus_dir=backend, fabric_dir=project + "/fabric", python=sys.executable,
                              agent="a", project_id="p")
    worker = WorkerProcess(build_launch(settings, cwd=project))
    kwargs = {"marker": marker} if function == "hang" else {}
    reply = worker.call(next_request_id(), "tools", function, [], kwargs, time.monotonic() + 600)
    print(reply["result"], flush=True)
    time.sleep(600)
""")


def _backend(tmp_path: Path) -> Path:
    backend = tmp_path / "icarus"
    backend.mkdir()
    (backend / "__init__.py").write_text("")
    (backend / "tools.py").write_text(HANGING_BACKEND)
    return backend


def _parent(tmp_path: Path, function: str) -> tuple[subprocess.Popen, Path]:
    project = tmp_path / "project"
    project.mkdir()
    marker = tmp_path / "started"
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(_backend(tmp_path)), str(project), function,
                             str(marker)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    return proc, marker


@pytest.mark.timeout(60)
def test_a_parent_killed_during_a_hung_call_takes_the_worker_and_its_children_with_it(tmp_path):
    parent, marker = _parent(tmp_path, "hang")
    try:
        wait_for(marker.exists, timeout=20, what="the hanging call to start")
        worker_pid, grandchild_pid = (int(x) for x in marker.read_text().split())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        started = time.monotonic()
        wait_for(lambda: gone(worker_pid) and gone(grandchild_pid), timeout=10,
                 what="the worker and the child its backend started to end with their parent")
        assert time.monotonic() - started < 5
    finally:
        parent.kill()
        for pid in (locals().get("worker_pid"), locals().get("grandchild_pid")):
            if pid and not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_an_idle_worker_ends_at_once_when_its_parent_is_killed(tmp_path):
    parent, _marker = _parent(tmp_path, "quick")
    try:
        worker_pid = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        started = time.monotonic()
        wait_for(lambda: gone(worker_pid), timeout=10, what="the idle worker to end")
        assert time.monotonic() - started < 5
    finally:
        parent.kill()


@pytest.mark.timeout(60)
def test_a_parent_that_closes_the_pipe_and_lives_on_gets_every_reply(tmp_path):
    """The pipe's hang-up alone is not the parent's death: requests written, the pipe closed at once
    (``subprocess.run(input=...)``), every reply still comes -- here 2.4 s of calls -- and the worker
    exits 0 at the end of the pipe."""
    from castor.adapters.icarus.launch import WORKER_PROGRAM

    env = {**os.environ, "CASTOR_ICARUS_DIR": str(_backend(tmp_path))}
    requests = b"".join(json.dumps({"id": n, "module": "tools", "function": "slow", "args": [n]}).encode() + b"\n"
                        for n in range(8))
    done = subprocess.run([sys.executable, "-u", str(WORKER_PROGRAM)], input=requests, capture_output=True,
                          env=env, cwd=tmp_path, timeout=30)
    lines = done.stdout.splitlines()
    assert lines[0] + b"\n" == READY_LINE and done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["result"] for line in lines[1:]] == list(range(8))


# A parent that starts the worker in its own process group (not castor's way) and waits to be killed.
SAME_GROUP_PARENT = textwrap.dedent("""
    import json, subprocess, sys, time
    program, marker = sys.argv[1:3]
    worker = subprocess.Popen([sys.executable, "-u", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    worker.stdout.readline()
    worker.stdin.write(json.dumps({"id": 1, "module": "tools", "function": "hang",
                                   "kwargs": {"marker": marker}}).encode() + b"\\n")
    worker.stdin.flush()
    time.sleep(600)
""")


@pytest.mark.timeout(60)
def test_a_worker_that_leads_no_group_kills_only_itself(tmp_path):
    """Started in its parent's process group (not castor's way), a busy worker whose parent dies
    must not signal that group: here it is the test's own."""
    from castor.adapters.icarus.launch import WORKER_PROGRAM

    env = {**os.environ, "CASTOR_ICARUS_DIR": str(_backend(tmp_path))}
    marker = tmp_path / "started"
    parent = subprocess.Popen([sys.executable, "-c", SAME_GROUP_PARENT, str(WORKER_PROGRAM), str(marker)],
                              env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
    grandchild = None
    try:
        wait_for(marker.exists, timeout=20, what="the hanging call to start")
        worker, grandchild = (int(x) for x in marker.read_text().split())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: gone(worker), timeout=10, what="the worker to end with its parent")
        assert not gone(grandchild)  # not its group to kill: the test's own process group lives on
    finally:
        parent.kill()
        if grandchild is not None and not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_busy_worker_whose_castor_died_before_it_ran_ends_with_it(tmp_path):
    """A castor that died before its worker ran at all (killed right after the spawn) left the
    worker the reaper's child from the start: its parent never changed, so a busy one ran for
    ever. The worker now also ends when the castor that named itself (CASTOR_WORKER_PARENT) is gone."""
    from castor.adapters.icarus.launch import PARENT_PID_ENV, WORKER_PROGRAM

    gone_castor = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_castor.wait(10)
    env = {**os.environ, "CASTOR_ICARUS_DIR": str(_backend(tmp_path)), PARENT_PID_ENV: str(gone_castor.pid)}
    marker = tmp_path / "started"
    worker = subprocess.Popen([sys.executable, "-u", str(WORKER_PROGRAM)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, cwd=tmp_path, process_group=0)
    grandchild = None
    try:
        assert worker.stdout.readline() == READY_LINE
        worker.stdin.write(json.dumps({"id": 1, "module": "tools", "function": "hang",
                                       "kwargs": {"marker": str(marker)}}).encode() + b"\n")
        worker.stdin.flush()
        wait_for(marker.exists, timeout=20, what="the hanging call to start")
        grandchild = int(marker.read_text().split()[1])
        worker.stdin.close()  # the pipe hangs up, as when the castor that wrote it died
        worker.wait(10)
        wait_for(lambda: gone(grandchild), timeout=10, what="the backend's child to end with the worker")
    finally:
        worker.kill()
        if grandchild is not None and not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)
