"""What castor creates is never writable by another user, whatever the umask it is started with.

Under ``umask 000`` a plain ``mkdir`` makes ``0777`` directories: castor's artifact root and every
run directory were open to every user, who could swap a saved cast's ``state.json`` (the
commands a trusted recast runs as castor's user) or plant files beside castor's own. Each test
runs a real ``python -m castor`` under ``umask 000`` and looks at the modes of what it made.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from .conftest import castor_argv, serve_env, wait_until

pytestmark = pytest.mark.timeout(120)

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _under_umask_000() -> None:
    os.umask(0)


def _writable_by_others(root: Path) -> list[str]:
    """Every file or directory under ``root`` (``root`` itself included) that group or others
    may write, with its mode; links are not followed."""
    found = []
    for path in (root, *root.rglob("*")):
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & OTHERS_WRITE:
            found.append(f"{oct(stat.S_IMODE(mode))} {path.relative_to(root.parent)}")
    return found


def _help_example(env: dict[str, str]) -> list:
    """The complete scripted-agent file ``castor cast --help`` prints (it drives the build loadout)."""
    text = subprocess.run(castor_argv("cast", "--help"), env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout
    start = text.index("\n  [\n") + 1
    return json.loads(text[start:text.index("\n  ]", start) + 4])


def test_a_cast_under_umask_000_makes_nothing_another_user_may_write(tmp_path):
    env = {**serve_env(tmp_path), "CASTOR_AGENT": "", "MATERIA_CONFIG": "",
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}
    project = tmp_path / "project"
    project.mkdir(mode=0o755)
    (project / "answers.json").write_text(json.dumps(_help_example(env)))
    done = subprocess.run(castor_argv("cast", "build two things", "--loadout", "build", "--agent",
                                      "script:answers.json", "--quiet"),
                          cwd=str(project), env=env, capture_output=True, text=True, timeout=100,
                          preexec_fn=_under_umask_000)
    assert done.returncode == 0, done.stderr
    run_dirs = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    assert len(run_dirs) == 1 and (run_dirs[0] / "sockets").is_dir(), run_dirs
    assert _writable_by_others(project) == []


def test_a_serve_under_umask_000_keeps_its_runtime_directory_token_and_socket_private(tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    home = tmp_path / "home"
    env = {**serve_env(tmp_path), "XDG_RUNTIME_DIR": str(xdg)}
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o700)
    path = sockets / "castor.sock"
    err = tmp_path / "serve.stderr"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(castor_argv("serve", "--socket", str(path), "--require-token"), env=env,
                                cwd=str(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=stderr, preexec_fn=_under_umask_000)
    try:
        wait_until(lambda: "castor serve: listening on" in err.read_text() or proc.poll() is not None, 30,
                   "the serving line")
        assert proc.poll() is None, err.read_text()
        assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) == 0o600
        runtime = xdg / "castor"
        assert stat.S_IMODE(runtime.lstat().st_mode) == 0o700
        tokens = list(runtime.iterdir())
        assert tokens and all(stat.S_IMODE(t.lstat().st_mode) == 0o600 for t in tokens), tokens
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))  # it listens: the modes above are those of a live serve
        probe.close()
        assert _writable_by_others(xdg) == [] and _writable_by_others(sockets) == []
        assert not home.exists() or _writable_by_others(home) == []
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_demo_workdir_castor_makes_under_umask_000_is_its_own_and_used(tmp_path):
    """``castor demo --workdir NEW`` made NEW ``0777`` under ``umask 000`` and then refused it as
    writable by others; castor's own directories are ``0755`` at most, so it is used."""
    workdir = tmp_path / "parent" / "demo"
    (tmp_path / "parent").mkdir(mode=0o755)
    code = ("import sys\n"
            "from castor.cli.common import private_workdir\n"
            "print(private_workdir(sys.argv[1]))\n")
    done = subprocess.run([*castor_argv()[:1], "-c", code, str(workdir)], env=serve_env(tmp_path),
                          capture_output=True, text=True, timeout=60, preexec_fn=_under_umask_000)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(workdir.lstat().st_mode) == 0o755
