"""``castor status`` names the process that runs a held cast's utility command by the visit and run
directory castor put in its environment. Another local user may start a process carrying that same
environment (a visit id and a run directory are no secrets); a castor run by root reads every
process's environment, and named theirs as the cast's command. Only castor's user's processes count."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from castor.adapters.materia.command_records import running_command
from castor.ports.utility_runner import RUN_DIR_ENV, VISIT_ID_ENV
from tests.support.other_user import NOBODY
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                 reason="a process of another user needs root and setpriv")]


def _holding(env: dict[str, str], *prefix: str) -> subprocess.Popen[bytes]:
    """A process (run as ``prefix``, e.g. another uid) that waits until its stdin closes."""
    return subprocess.Popen([*prefix, sys.executable, "-c", "import sys; sys.stdin.read()"],
                            env={**os.environ, **env}, stdin=subprocess.PIPE)


def test_another_users_process_with_a_cast_s_visit_in_its_environment_is_never_named_its_command(tmp_path):
    run_dir = str(tmp_path / "run")
    visit = "2026-12-07T00-00-00-000Z:Socket-2:1:2"
    tagged = {VISIT_ID_ENV: visit, RUN_DIR_ENV: run_dir}
    theirs = _holding(tagged, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    ours = None
    try:
        wait_for(lambda: os.path.exists(f"/proc/{theirs.pid}") and
                 os.stat(f"/proc/{theirs.pid}").st_uid == NOBODY, timeout=10, what="the other user's process")
        wait_for(lambda: b"sys.stdin.read" in open(f"/proc/{theirs.pid}/cmdline", "rb").read(), timeout=10,
                 what="the other user's process to run python")
        assert running_command(run_dir, visit) is None
        ours = _holding(tagged)  # castor's user's own process with that environment is named
        found = wait_for(lambda: running_command(run_dir, visit), timeout=10, what="our process named")
        assert found["pid"] == ours.pid, found
    finally:
        for proc in (theirs, ours):
            if proc is not None:
                proc.stdin.close()
                proc.wait(10)
