"""The extension as a Pi package: ``npm pack`` it, ``pi install`` the tarball into a fresh Pi agent
directory (``PI_CODING_AGENT_DIR``, never ``~/.pi``), and run a cast with what Pi installed — no
``-e``, no ``--castor-command``: castor is found by ``--castor-python`` or on ``PATH``, and the
materia config comes from ``--materia-config``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import poll_until

from .conftest import python_env, read_jsonl
from .pi_rpc import REPO, PiInstall, PiRpc, write_agent_dir

pytestmark = [pytest.mark.pi, pytest.mark.timeout(120)]

EXT_DIR = REPO / "integrations" / "pi"
PACKAGE = "castor-pi-extension"

CONFIG = {
    "artifactDir": "castor-runs",
    "activeLoadout": "Two-Step",
    "materia": {
        "Planner": {"prompt": "PACKAGED-PLANNER: plan the request.", "tools": "none"},
        "Writer": {"prompt": "PACKAGED-WRITER: write the result.", "tools": "none"},
    },
    "loadouts": {"Two-Step": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "Planner", "parse": "text",
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Writer", "parse": "text"},
    }}},
}


def node_env(pi_install: PiInstall, home: Path, agent_dir: Path, path: str | None = None) -> dict[str, str]:
    return {**os.environ, "PATH": f"{pi_install.node.parent}{os.pathsep}{path or os.environ.get('PATH', '')}",
            "HOME": str(home), "PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1",
            "npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"}


@pytest.fixture(scope="module")
def tarball(pi_install: PiInstall, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``npm pack`` of integrations/pi (its bundled dependency comes from .ci/install-pi.sh)."""
    dest = tmp_path_factory.mktemp("pack")
    env = node_env(pi_install, dest, dest / "unused-agent")
    out = subprocess.run(["npm", "pack", "--pack-destination", str(dest), "--json"], cwd=EXT_DIR, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (packed,) = json.loads(out.stdout)
    return dest / packed["filename"]


@pytest.fixture
def installed(pi_install: PiInstall, tarball: Path, fake_llm, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A fresh agent dir (models pointing at the fake LLM) with the package ``pi install``-ed into it;
    yields (agent dir, HOME)."""
    home, agent_dir = tmp_path / "home", tmp_path / "agent"
    home.mkdir()
    write_agent_dir(agent_dir, fake_llm.base_url)
    source = f"npm:{PACKAGE}@file:{tarball}"
    run = subprocess.run(
        [str(pi_install.node), str(pi_install.cli), "install", source],
        env=node_env(pi_install, home, agent_dir),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, (run.stdout, run.stderr)
    yield agent_dir, home


def start(pi_install: PiInstall, tmp_path: Path, agent_dir: Path, home: Path, project: Path, args: list[str],
          path: str | None = None) -> PiRpc:
    env = {**python_env(), "HOME": str(home)}
    if path is not None:
        env["PATH"] = path
    return PiRpc(pi_install, cwd=project, agent_dir=agent_dir, session_dir=tmp_path / "sessions", castor_command=None,
                 env=env, timeout_ms=15000, load_extension=False, extra_args=args)


def up(pi: PiRpc) -> dict:
    return pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith(("castor: up", "castor: down")),
                      timeout=40)


def test_npm_pack_makes_a_pi_package_with_its_dependency_bundled(tarball):
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("package/package.json"))
    assert manifest["pi"]["extensions"] == ["./src/index.ts"] and "pi-package" in manifest["keywords"]
    assert {"package/src/index.ts", "package/src/turns.ts", "package/src/locate.ts"} <= names
    assert "package/node_modules/@msgpack/msgpack/package.json" in names, "the runtime dependency is bundled"
    # Pi supplies its own packages: never bundled, declared as peers; no dev tooling or tests shipped.
    assert set(manifest["peerDependencies"]) == {"@earendil-works/pi-coding-agent", "typebox"}
    assert not [n for n in names if "/typescript/" in n or "/@earendil-works/" in n or n.startswith("package/test/")]


def test_pi_install_into_a_fresh_agent_dir_then_a_cast_runs_with_the_installed_extension(
        pi_install, installed, fake_llm, tmp_path):
    agent_dir, home = installed
    settings = json.loads((agent_dir / "settings.json").read_text())
    assert any(PACKAGE in str(p) for p in settings["packages"])
    assert (agent_dir / "npm" / "node_modules" / PACKAGE / "src" / "index.ts").exists()
    assert not (home / ".pi").exists(), "pi install wrote only into PI_CODING_AGENT_DIR"
    listed = subprocess.run([str(pi_install.node), str(pi_install.cli), "list"], capture_output=True, text=True,
                            timeout=60, env=node_env(pi_install, home, agent_dir))
    assert PACKAGE in listed.stdout, listed.stdout + listed.stderr

    project = tmp_path / "project"
    (project / "castor-config").mkdir(parents=True)
    (project / "castor-config" / "materia.json").write_text(json.dumps(CONFIG))  # not .pi/: only the flag finds it
    fake_llm.reply_text("PLANNED-BY-PACKAGE", when="PACKAGED-PLANNER")
    fake_llm.reply_text("WRITTEN-BY-PACKAGE", when="PACKAGED-WRITER")
    pi = start(pi_install, tmp_path, agent_dir, home, project,
               ["--castor-python", sys.executable, "--materia-config", "castor-config/materia.json"])
    try:
        assert up(pi)["statusText"].startswith("castor: up"), pi.stderr()[-3000:]
        start_at = pi.command("/materia cast build it")
        assert poll_until(lambda: list((project / "castor-runs").glob("*/events.jsonl")), timeout=20), pi.tail()
        (events_file,) = (project / "castor-runs").glob("*/events.jsonl")
        assert poll_until(lambda: any(e["type"] == "cast_end" for e in read_jsonl(events_file)), timeout=30), pi.tail()
        events = read_jsonl(events_file)
        assert events[-1]["data"]["ok"] is True, events[-1]
        assert "castor-config/materia.json" in events[0]["data"]["configSource"]
        assert [e["data"]["socket"] for e in events if e["type"] == "socket_complete"] == ["Socket-1", "Socket-2"]
        assert [e.get("message") for e in pi.ui("notify", start=start_at) if e.get("notifyType") == "error"] == []
    finally:
        pi.close()


def test_the_installed_extension_finds_castor_on_path_or_says_how_to_point_at_it(pi_install, installed, tmp_path):
    agent_dir, home = installed
    project = tmp_path / "project"
    project.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    castor = bin_dir / "castor"  # what `pip install castor` puts on PATH, for this interpreter
    castor.write_text(f"#!/bin/sh\nexec {sys.executable} -m castor \"$@\"\n")
    castor.chmod(0o755)
    base_path = f"{pi_install.node.parent}{os.pathsep}/usr/bin{os.pathsep}/bin"
    assert not any((Path(d) / "castor").exists() for d in base_path.split(os.pathsep))

    pi = start(pi_install, tmp_path, agent_dir, home, project, [], path=f"{bin_dir}{os.pathsep}{base_path}")
    try:
        assert up(pi)["statusText"].startswith("castor: up"), pi.stderr()[-3000:]
        cmd = pi.command("/materia casts")
        note = pi.wait_ui("notify", start=cmd, timeout=20)
        assert note.get("notifyType") != "error", note
    finally:
        pi.close()

    pi = start(pi_install, tmp_path / "second", agent_dir, home, project, [], path=base_path)
    try:
        note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", timeout=40)
        assert "castor is not on PATH" in note["message"] and "--castor-python" in note["message"], note
        cmd = pi.command("/materia casts")  # still no castor: the command says so, Pi keeps running
        again = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=cmd, timeout=20)
        assert "castor is not on PATH" in again["message"]
        assert pi.proc.poll() is None
    finally:
        pi.close()


def test_pi_install_of_the_unpacked_package_directory_loads_it_in_place(pi_install, tarball, fake_llm, tmp_path):
    """The other install form: a local directory (Pi loads it where it is; its bundled dependency
    makes it complete without npm)."""
    home, agent_dir = tmp_path / "home", tmp_path / "agent"
    home.mkdir()
    write_agent_dir(agent_dir, fake_llm.base_url)
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    package_dir = tmp_path / "unpacked" / "package"
    run = subprocess.run([str(pi_install.node), str(pi_install.cli), "install", str(package_dir)],
                         env=node_env(pi_install, home, agent_dir), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert not (agent_dir / "npm").exists(), "a local package is not copied"
    project = tmp_path / "project"
    project.mkdir()
    pi = start(pi_install, tmp_path, agent_dir, home, project, ["--castor-python", sys.executable])
    try:
        assert up(pi)["statusText"].startswith("castor: up"), pi.stderr()[-3000:]
    finally:
        pi.close()


def test_an_untrusted_projects_python_files_are_never_imported_in_castors_place(pi_install, installed, tmp_path):
    """castor starts in the project's directory. Started as ``<python> -m castor`` that directory came
    first on Python's import path, so a checkout's ``loguru.py`` (or a ``castor/`` package of its
    own) ran as the user before anything was trusted; an empty ``PYTHONPATH`` entry (``:/x``) named it
    for the ``castor`` script too. The extension now runs the interpreter with ``-P`` and hands castor
    only ``PYTHONPATH``'s absolute entries: the project's files are not imported, castor comes up."""
    agent_dir, home = installed
    project = tmp_path / "project"
    (project / "castor").mkdir(parents=True)
    marker = tmp_path / "imported-from-the-project"
    plant = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("loguru.py", "msgpack.py", "castor/__init__.py", "castor/__main__.py"):
        (project / name).write_text(plant)
    env = {**python_env(), "HOME": str(home)}
    env["PYTHONPATH"] = f":{env['PYTHONPATH']}:relative/dir"
    pi = PiRpc(pi_install, cwd=project, agent_dir=agent_dir, session_dir=tmp_path / "sessions", castor_command=None,
               env=env, timeout_ms=15000, load_extension=False, extra_args=["--castor-python", sys.executable])
    try:
        assert up(pi)["statusText"].startswith("castor: up"), pi.stderr()[-3000:]
        assert not marker.exists(), marker.read_text()
    finally:
        pi.close()
