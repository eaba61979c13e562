"""``castor cast`` with its stderr a pipe that no one reads (a log pipe that stalls, ``2>&1 | tool``
whose tool hangs).

The cast's notices and log lines were written to it blocking: once the pipe was full, the thread
that said something waited for good, the cast ran no further (a one-turn cast never ended) and the
command no longer stopped on SIGTERM, nor on a second one. The command now relays its stderr as
``castor serve`` does: what does not fit is dropped (the cast's events keep every notice), the
cast goes on, and a signal ends the command."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

from .conftest import CASTOR, castor_env

pytestmark = pytest.mark.timeout(120)

F_SETPIPE_SZ = 1031


def _project(tmp: Path, answer: dict[str, object]) -> Path:
    """One agent socket, and 300 fields no one reads: the cast's first transition says a warning
    of ~250 bytes for each, far more than the pipe below holds."""
    project = tmp / "project"
    (project / ".pi").mkdir(parents=True)
    config: dict[str, object] = {
        "activeLoadout": "One", "materia": {"planner": {"prompt": "plan {{request}}", "tools": "none"}},
        "loadouts": {"One": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "planner"}}}}}
    config.update({f"unread{i:03d}": i for i in range(300)})
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (project / "answers.json").write_text(json.dumps([answer]))
    return project


def _cast_with_a_stalled_stderr(tmp: Path, project: Path) -> tuple[subprocess.Popen[bytes], Path, int]:
    """``castor cast`` with stdout to a file and stderr a 4 KiB pipe whose read end is kept and never read."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    out = tmp / "stdout.txt"
    with open(out, "wb") as stdout:
        proc = subprocess.Popen([*CASTOR, "cast", "q", "--agent", "script:answers.json", "--quiet"],
                                env=castor_env(tmp), cwd=str(project), stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=write_end)
    os.close(write_end)
    return proc, out, read_end


def test_a_cast_runs_to_its_end_while_no_one_reads_its_stderr(tmp_path):
    project = _project(tmp_path, {"text": "done"})
    proc, out, read_end = _cast_with_a_stalled_stderr(tmp_path, project)
    try:
        with killed_on_exit(proc):
            assert proc.wait(60) == 0, out.read_text()
        lines = out.read_text().splitlines()
        assert len(lines) == 2 and " started (One): " in lines[0] and " complete: " in lines[1], lines
    finally:
        os.close(read_end)


def test_a_cast_whose_stderr_no_one_reads_stops_on_sigterm(tmp_path):
    project = _project(tmp_path, {"text": "done", "delay_ms": 60_000})
    proc, out, read_end = _cast_with_a_stalled_stderr(tmp_path, project)
    try:
        with killed_on_exit(proc):
            # the turn is under way (its context written): the warnings were said long before
            wait_for(lambda: any((project / ".pi" / "pi-materia").glob("*/contexts/Socket-1-1.md"))
                     or proc.poll() is not None, timeout=30, what="the cast's first turn")
            assert proc.poll() is None, out.read_text()
            proc.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic() + 20
            wait_for(lambda: proc.poll() is not None, timeout=20, what="the command's end after SIGTERM")
            assert time.monotonic() < stopped_at
            assert proc.returncode == 128 + signal.SIGTERM
        [run] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
        assert json.loads((run / "state.json").read_text())["state"]["active"]  # resumable, as on any stop
    finally:
        os.close(read_end)
