"""Run a command inside a private network namespace (loopback only), for the Ray tests.

Ray binds to the machine's interface address; these tests may only use loopback. In a fresh
namespace (``unshare -n``, root only) the only interface is ``lo``, so every Ray node binds
127.0.0.1 and nothing leaves the machine. Packages must be installed before: the namespace has
no registry access.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def ray_available() -> str | None:
    """None when the Ray tests can run here, else the one-line reason they cannot."""
    try:
        import ray  # noqa: F401 - only whether ray imports
    except ImportError:
        return "Ray is not installed (pip install '.[ray]')"
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return "a private network namespace needs root, unshare and ip"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.decode(errors='replace').strip()[:200]}"
    return None


def require_ray() -> None:
    reason = ray_available()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


def run_in_netns(argv: list[str], *, timeout_s: float, cwd: Path | None = None,
                 env_extra: dict[str, str] | None = None, own_pids: bool = False) -> subprocess.CompletedProcess[str]:
    """``argv`` in a private network namespace. ``own_pids``: in a private process namespace too
    (with its own ``/proc``), for a command that runs ``ray stop``: that kills every Ray process it
    can see, and on the machine's ``/proc`` it killed the clusters of the tests running beside it
    (``pytest -n 2``: a scenario's driver exited "Failed to connect to GCS within 60 seconds")."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1", **(env_extra or {})}
    unshare = ["unshare", "-n", *(["--pid", "--fork", "--mount", "--mount-proc"] if own_pids else [])]
    return subprocess.run([*unshare, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv],
                          capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)


def scenario(name: str, workdir: Path, *, timeout_s: float = 240.0) -> dict[str, Any]:
    script = Path(__file__).with_name("ray_scenarios.py")
    proc = run_in_netns([sys.executable, str(script), name, str(workdir)], timeout_s=timeout_s)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"scenario {name} printed no RESULT (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
