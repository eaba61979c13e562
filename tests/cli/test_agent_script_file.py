"""``--agent script:FILE`` reads FILE the way a config layer is read: only a regular file, at most
16 MiB. A FIFO kept ``castor cast`` blocked in ``open`` (one SIGTERM no longer ended it) and
``/dev/zero`` was read whole into memory (a MemoryError traceback, or the OOM killer); both are
now one ``invalid_config`` line naming the file, at once, with nothing started."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.agents.scripted import MAX_SCRIPT_BYTES, ScriptedAgent, load_script
from castor.messages.errors import InvalidConfig

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def _castor(tmp_path: Path, *args: str, limit_memory: bool = False) -> subprocess.CompletedProcess[str]:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)

    def memory_cap() -> None:  # as `ulimit -v 1500000`: reading /dev/zero whole dies of MemoryError, not the OOM killer
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000 * 1024, 1_500_000 * 1024))

    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    # A castor that blocks on the FIFO never ends by itself: the timeout is the failure.
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=project, env=env, text=True,
                          capture_output=True, timeout=60, preexec_fn=memory_cap if limit_memory else None)


def _refused(result: subprocess.CompletedProcess[str], path: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"castor: invalid_config: cannot read agent script {path}: not a regular file")
    assert "16 MiB" in lines[0]


def test_a_fifo_as_the_answers_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "answers.json"
    os.mkfifo(fifo)
    result = _castor(tmp_path, "cast", "x", "--quiet", "--agent", f"script:{fifo}")
    _refused(result, str(fifo))
    assert not (tmp_path / "project" / ".pi").exists()  # nothing started, nothing written


def test_dev_zero_as_the_answers_file_is_refused_not_read(tmp_path: Path) -> None:
    result = _castor(tmp_path, "cast", "x", "--quiet", "--agent", "script:/dev/zero", limit_memory=True)
    _refused(result, "/dev/zero")


def test_an_answers_file_over_the_cap_is_refused_naming_it(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(MAX_SCRIPT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(InvalidConfig) as refused:
        load_script(big)
    assert str(big) in refused.value.message and "larger than" in refused.value.message, refused.value.message
    assert "16 MiB" in refused.value.message


def test_an_answers_file_at_the_cap_is_still_read(tmp_path: Path) -> None:
    exact = tmp_path / "exact.json"
    body = b'["hi"]'
    exact.write_bytes(body + b" " * (MAX_SCRIPT_BYTES - len(body)))
    agent = ScriptedAgent(exact)
    try:
        assert [a.text for a in agent.script.by_socket["*"]] == ["hi"]
    finally:
        agent.close()
