"""A project with one agent socket, the CLI run as a user runs it, and a cast of it interrupted at
its first turn (the scripted agent's answer is an Esc): what the damaged-run-directory and
JSON-limit tests start from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ONE_SOCKET = {"activeLoadout": "One", "loadouts": {"One": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter"}}}}}


def castor_cli(tmp_path: Path, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m castor ARGS`` in ``cwd`` with a home of its own under ``tmp_path``; a command
    that outlives ``timeout`` fails the test as hung."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    try:
        return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"castor {' '.join(args)} hung")


def interrupted_cast(tmp_path: Path) -> tuple[Path, Path]:
    """The project (with ``answers.json``, a turn that answers ``hi``) and the run directory of its
    cast, interrupted at its first turn and resumable with ``castor continue``."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (root / "esc.json").write_text(json.dumps([{"text": "x", "stop_reason": "aborted"}]))
    (root / "answers.json").write_text(json.dumps(["hi"]))
    interrupted = castor_cli(tmp_path, "cast", "x", "--agent", "script:esc.json", "--quiet", cwd=root)
    assert interrupted.returncode == 1 and "interrupted" in interrupted.stderr, interrupted.stderr
    [run] = [p for p in (root / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    return root, run
