"""``castor cast`` / ``castor recast --backend ray`` from a project directory, as a user runs them."""

from __future__ import annotations

import json
import secrets
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


def test_a_running_cluster_is_joined_by_its_gcs_address_and_by_a_ray_client_address(tmp_path: Path) -> None:
    """A cluster started with ``ray start`` (as an operator starts one), joined twice from a project
    directory: by its GCS ``HOST:PORT`` and by a Ray Client ``ray://HOST:PORT`` (the form a remote
    cluster is usually reached by). Each cast's utility command runs as a cluster task. Before, the
    ``ray://`` form was accepted by the flag check but failed at Ray's connect with "Ray Client
    requires pip package `ray[client]`" (the extra lacked Ray Client's gRPC package)."""
    require_ray()
    proj = tmp_path / "proj"
    (proj / ".pi").mkdir(parents=True)
    (proj / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "one", "loadouts": {"one": {
        "entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", "command": ON_CLUSTER, "parse": "text"}}}}}))
    (proj / "a.json").write_text(json.dumps(["hi"]))
    home = tmp_path / "home"  # Ray keeps its auth token under ~/.ray: this cluster's, not the user's
    home.mkdir()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    castor = [sys.executable, "-m", "castor", "cast", "build", "--agent", "script:a.json", "--quiet",
              "--backend", "ray"]
    script = "\n".join([
        "set -u",
        f"{ray_bin!r} start --head --port=26379 --ray-client-server-port=26380 --num-cpus=2 "
        "--disable-usage-stats > ray-start.log 2>&1 || { cat ray-start.log; exit 90; }",
        "rc=0",
        " ".join(map(repr, castor)) + " --ray-address 127.0.0.1:26379 > gcs.out 2>&1 || rc=$((rc + 1))",
        # Ray Client starts a server process per driver, and under load (the full suite on two
        # cores) that start sometimes fails at once, in Ray ("Starting Ray client server failed",
        # its log empty), or its connect gives up (castor's one line: ray_connect_failed): a user's
        # second try connects. Up to three tries for those failures only; each try's output is kept.
        "for try in 1 2 3; do",
        "  " + " ".join(map(repr, castor)) + " --ray-address ray://127.0.0.1:26380 > client.out 2>&1; crc=$?",
        "  cat client.out >> client-tries.out",
        "  [ $crc -eq 0 ] && break",
        "  grep -q -e 'Starting Ray client server failed' -e 'ray_connect_failed' client.out || break",
        "done",
        "[ $crc -eq 0 ] || rc=$((rc + 10))",
        f"{ray_bin!r} stop --force > /dev/null 2>&1",
        "exit $rc",
    ])
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # both sides: `ray start` turns it on
    # own_pids: the script's `ray stop` sees only this cluster (on the machine's /proc it killed every Ray there)
    proc = run_in_netns(["sh", "-c", script], timeout_s=170, cwd=proj, env_extra={"HOME": str(home), **token},
                        own_pids=True)
    outputs = {name: (proj / name).read_text()[-3000:] if (proj / name).exists() else ""
               for name in ("gcs.out", "client-tries.out")}
    if proc.returncode != 0:  # which join failed (exit 1: the GCS address, 10: the Ray Client one), and how
        pytest.fail(f"exit {proc.returncode}\n" + "\n".join(f"--- {name}\n{text}" for name, text in outputs.items())
                    + f"\n--- stderr\n{proc.stderr[-2000:]}", pytrace=False)
    stdouts = sorted((proj / ".pi" / "pi-materia").glob("*/sockets/Socket-1/*.command.stdout.txt"))
    assert len(stdouts) == 2, stdouts
    for path in stdouts:
        assert path.read_text().startswith("on node "), (path, path.read_text())


def test_ray_stop_in_a_test_reaches_only_its_own_cluster() -> None:
    """``ray stop`` kills every Ray-looking process it can see: the test above ran it on the
    machine's ``/proc``, so under ``pytest -n 2`` it killed the cluster of the scenario running
    beside it (its driver exited "Failed to connect to GCS within 60 seconds"), and any other Ray
    on the machine. Run with ``own_pids`` it sees only its own namespace's processes: a process
    outside that looks like Ray's (``log_monitor.py`` in its arguments) lives on."""
    require_ray()
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "log_monitor.py"])
    try:
        ray_bin = str(Path(sys.executable).with_name("ray"))
        proc = run_in_netns([ray_bin, "stop", "--force"], timeout_s=60, own_pids=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert decoy.poll() is None, "ray stop killed a process outside its namespace"
    finally:
        decoy.kill()
        decoy.wait()
