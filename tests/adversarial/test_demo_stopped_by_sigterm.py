"""``castor demo`` stopped by SIGTERM (a service manager, ``timeout``, ``kill``) mid-way.

Python's default ended it on the spot: no ``castor: interrupted``, none of its runtimes shut down,
and nothing said where the evidence of what it had done so far was kept. It now stops as on
Ctrl-C: its runtimes shut down, it names the directory it kept, and exits 143."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

from .conftest import CASTOR, castor_env

pytestmark = pytest.mark.timeout(120)


def test_a_demo_stopped_by_sigterm_says_so_names_what_it_kept_and_leaves_no_process(tmp_path: Path):
    err = tmp_path / "demo.stderr"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([*CASTOR, "demo", "--quiet"], env=castor_env(tmp_path), cwd=str(tmp_path),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    with killed_on_exit(proc):
        # under way: its casts section has made its first project
        wait_for(lambda: any(tmp_path.glob("castor-demo-*/casts/*")) or proc.poll() is not None, timeout=60,
                 what="the demo's casts section")
        assert proc.poll() is None, err.read_text()
        [workdir] = tmp_path.glob("castor-demo-*")
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: proc.poll() is not None, timeout=30, what="the demo's end after SIGTERM")
    said = err.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, said
    assert f"castor demo: stopped before its end; kept: {workdir}\n" in said, said
    assert said.endswith("castor: interrupted\n"), said
    left = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
