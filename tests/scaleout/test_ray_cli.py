"""``castor cast`` / ``castor recast --backend ray`` from a project directory, as a user runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .netns import REPO, require_ray, run_in_netns

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

# Succeeds only as a cluster task: the Ray runner puts CASTOR_NODE_ID in the command's environment.
ON_CLUSTER = ["sh", "-c", 'test -n "$CASTOR_NODE_ID" && echo "on node $CASTOR_NODE_ID"']


def test_a_cast_failed_here_is_recast_on_a_local_ray_that_no_ray_address_around_redirects(tmp_path: Path) -> None:
    """Two faults in one run (a local Ray's start is most of it):

    - ``castor recast/continue/revive`` took no ``--backend``: a cast could be resumed only in the
      process that recasts it (``unrecognized arguments: --backend ray``, exit 2).
    - without ``--ray-address`` castor is to start a Ray of its own, but Ray joins whatever
      ``RAY_ADDRESS`` or the world-writable ``/tmp/ray/ray_current_cluster`` names (a stale or
      another user's cluster): here an address nobody answers at, and castor waited on it, then failed.
    """
    require_ray()
    proj = tmp_path / "my proj é"  # a path with a space and a non-ASCII letter
    (proj / ".pi").mkdir(parents=True)
    (proj / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "one", "loadouts": {"one": {
        "entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", "command": ON_CLUSTER, "parse": "text"}}}}}))
    (proj / "a.json").write_text(json.dumps(["hi"]))
    local = subprocess.run([sys.executable, "-m", "castor", "cast", "build", "--agent", "script:a.json", "--quiet"],
                           cwd=proj, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO),
                                                                                       "PATH": "/usr/bin:/bin"})
    assert local.returncode == 1 and "failed: Utility command" in local.stderr, local.stderr  # not a cluster task here
    with socket.socket() as probe:  # a port nothing listens at
        probe.bind(("127.0.0.1", 0))
        decoy = f"127.0.0.1:{probe.getsockname()[1]}"
    proc = run_in_netns([sys.executable, "-m", "castor", "recast", "latest", "--agent", "script:a.json", "--quiet",
                         "--backend", "ray"], timeout_s=150, cwd=proj, env_extra={"RAY_ADDRESS": decoy})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "complete" in proc.stdout + proc.stderr, proc.stdout + proc.stderr[-3000:]
    stdout = next((proj / ".pi" / "pi-materia").glob("*/sockets/Socket-1/2.command.stdout.txt"))
    assert stdout.read_text().startswith("on node "), stdout.read_text()
