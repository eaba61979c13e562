"""A malformed agent spec (``--agent`` or ``CASTOR_AGENT``) is a usage error: one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("argv, env", [
    (["cast", "hi"], {"CASTOR_AGENT": "bogus"}),
    (["cast", "hi", "--agent", "foo:bar"], {}),
    (["recast", "latest"], {"CASTOR_AGENT": "script:"}),
    (["continue", "latest", "--agent", "openai"], {}),
])
def test_a_malformed_agent_spec_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "castor", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=50, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent spec must be" in lines[0], proc.stderr
    assert not (tmp_path / ".pi").exists()  # nothing started, nothing written
