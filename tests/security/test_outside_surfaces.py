"""castor's endpoint and operator surfaces met from the outside: hostile flags, peers and paths.

Each test drives a real ``python -m castor`` subprocess (so what a user or another local
process meets is what is checked) and waits on the process or on a deadline, never on a sleep.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import castor_argv, serve_env

pytestmark = pytest.mark.timeout(120)


def _runtime_dir(tmp: Path) -> Path:
    xdg = tmp / "xdg"
    xdg.mkdir(mode=0o700, exist_ok=True)
    return xdg


@pytest.mark.parametrize("extra", [
    ("--console-token-file", "CONSOLE_TOKEN"),  # without --console
    ("--console", "127.0.0.1:0", "--console-token-file", "CONSOLE_TOKEN"),  # a token file others may read
], ids=["console-token-without-console", "console-token-readable-by-others"])
def test_a_serve_refused_at_its_flags_leaves_no_token_file_behind(tmp_path, extra):
    """``castor serve --tcp`` whose console flags are refused used to have made the endpoint's
    token file first and exit 2 leaving it in the runtime directory: a secret nobody removes,
    one per refused start. A refused start now leaves the runtime directory as it found it."""
    xdg = _runtime_dir(tmp_path)
    console_token = tmp_path / "console.token"
    console_token.write_text("c" * 32 + "\n")
    console_token.chmod(0o644)
    argv = castor_argv("serve", "--tcp", "127.0.0.1:0",
                       *(str(console_token) if a == "CONSOLE_TOKEN" else a for a in extra))
    done = subprocess.run(argv, env={**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(xdg)}, cwd=str(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("castor: "), done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in xdg.rglob("*") if not p.is_dir()) == []
