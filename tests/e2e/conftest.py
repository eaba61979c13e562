"""Fixtures for the real-Pi end-to-end tests (marker ``pi``).

Pi itself comes from ``.ci/install-pi.sh``. Without that install the tests are skipped on
a developer machine, but under ``CI`` (any non-empty value) a missing install is a
failure: CI must never turn green by skipping the harness tests.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .fake_llm import FakeLLM
from .pi_rpc import REPO, PiInstall, PiRpc, write_agent_dir
from .pi_tty import PiTty

PROBE = Path(__file__).with_name("probe_castor.py")
SERVE = Path(__file__).with_name("castor_serve.py")


@pytest.fixture(scope="session")
def pi_install() -> PiInstall:
    install = PiInstall.find()
    if install is None:
        message = "Pi is not installed: run .ci/install-pi.sh"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)")
        pytest.skip(message)
    return install


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


def python_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


@pytest.fixture
def probe_command(tmp_path: Path) -> tuple[list[str], Path]:
    """The PROBE castor (tests/e2e/probe_castor.py) and its call log."""
    return [sys.executable, str(PROBE)], tmp_path / "probe.jsonl"


@pytest.fixture
def castor_command() -> list[str]:
    """The real runtime: ``castor serve --stdio`` under this interpreter."""
    return [sys.executable, str(SERVE)]


@pytest.fixture
def start_pi(pi_install: PiInstall, fake_llm: FakeLLM, tmp_path: Path) -> Iterator[Callable[..., PiRpc]]:
    """Start Pi (RPC mode + extension) in a fresh project dir; every Pi is torn down."""
    started: list[PiRpc] = []

    def start(castor_command: list[str], *, env: dict[str, str] | None = None, timeout_ms: int = 15000,
              cwd: Path | None = None, settings: dict[str, Any] | None = None,
              extra_args: list[str] | None = None) -> PiRpc:
        project = cwd or tmp_path / "project"
        project.mkdir(parents=True, exist_ok=True)
        agent_dir = tmp_path / "agent"
        write_agent_dir(agent_dir, fake_llm.base_url, settings)
        pi = PiRpc(pi_install, cwd=project, agent_dir=agent_dir, session_dir=tmp_path / "sessions",
                   castor_command=castor_command, env={**python_env(), "HOME": str(tmp_path / "home"), **(env or {})},
                   timeout_ms=timeout_ms, extra_args=extra_args)
        started.append(pi)
        return pi

    yield start
    for pi in started:
        pi.close()


@pytest.fixture
def start_tty(pi_install: PiInstall, fake_llm: FakeLLM, tmp_path: Path) -> Iterator[Callable[..., PiTty]]:
    """Start the interactive Pi (its terminal UI on a pseudo-terminal, pi_tty.py) with the extension in
    a fresh project dir; every one is torn down."""
    started: list[PiTty] = []

    def start(castor_command: list[str], *, env: dict[str, str] | None = None,
              settings: dict[str, Any] | None = None, timeout_ms: int = 15000) -> PiTty:
        agent_dir = tmp_path / "agent"
        write_agent_dir(agent_dir, fake_llm.base_url, settings)
        project = tmp_path / "project"
        project.mkdir(exist_ok=True)
        pi = PiTty(pi_install, cwd=project, agent_dir=agent_dir, session_dir=tmp_path / "sessions",
                   castor_command=castor_command, env={**python_env(), "HOME": str(tmp_path / "home"), **(env or {})},
                   timeout_ms=timeout_ms)
        started.append(pi)
        return pi

    yield start
    for pi in started:
        pi.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file another process may still be appending to: a last line
    without its newline is not written yet (a poll can catch it half-written), so it is left out."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text if text.endswith("\n") else text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def session_entries(session_dir: Path) -> list[dict[str, Any]]:
    """All entries of every Pi session file under ``session_dir``."""
    entries: list[dict[str, Any]] = []
    for file in sorted(session_dir.rglob("*.jsonl")):
        entries.extend(read_jsonl(file))
    return entries
