"""Paths a client sends are confined to the session's project: ``config.validate`` reads nothing outside.

Over a real ``castor serve --socket`` with castor's client. The secret outside the project
is a valid config whose loadout name would show up in an answer if it were read; a read is
also caught by the file's access time (set far in the past, so even ``relatime`` updates it
on a read — the detector is checked on this file system first).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from castor.domain.paths import CONFINEMENT_REASONS
from castor.messages.errors import CastorError

pytestmark = pytest.mark.timeout(60)

SECRET = "SECRET-LOADOUT-FROM-OUTSIDE"


def _secret_config(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"activeLoadout": SECRET, "loadouts": {SECRET: {"entry": "Nope", "sockets": {}}}}))
    return path


def _age_atime(path: Path) -> int:
    """Set the access time well before the modification time; return it (ns)."""
    st = os.stat(path, follow_symlinks=True)
    old = st.st_mtime_ns - 10**12
    os.utime(path, ns=(old, st.st_mtime_ns), follow_symlinks=True)
    return old


def _atime_detects_reads(tmp_path: Path) -> bool:
    probe = tmp_path / "atime-probe"
    probe.write_text("x")
    before = _age_atime(probe)
    probe.read_bytes()
    return os.stat(probe).st_atime_ns != before


def test_config_validate_refuses_absolute_parent_and_symlinked_paths_and_reads_nothing(socket_server, tmp_path):
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    outside = tmp_path / "outside"
    secret = _secret_config(outside / "secret.json")
    unreadable = _secret_config(outside / "mode000.json")
    unreadable.chmod(0o000)
    fifo = outside / "fifo.json"
    os.mkfifo(fifo)
    (project / "link.json").symlink_to(secret)
    (project / "linkdir").symlink_to(outside, target_is_directory=True)
    (project / "fifo-link.json").symlink_to(fifo)
    inside = project / "inside.json"
    inside.write_text(json.dumps({"activeLoadout": "default"}))
    (project / "inside-link.json").symlink_to(inside)
    detector = _atime_detects_reads(tmp_path)
    atimes = {p: _age_atime(p) for p in (secret, unreadable)}

    attacks = [str(secret), str(unreadable), str(fifo), "../outside/secret.json", "sub/../../outside/secret.json",
               "link.json", "linkdir/secret.json", "linkdir/mode000.json", "fifo-link.json", "/etc/passwd",
               "/nonexistent/secret.json", "../nonexistent.json", "x\x00y.json", "./../outside/secret.json",
               str(project) + "/../outside/secret.json", "linkdir/nonexistent.json"]
    with socket_server.client() as client:
        client.call("session.open", {"session_id": "v1", "cwd": str(project)})
        refused = []
        for path in attacks:
            with pytest.raises(CastorError) as caught:
                client.call("config.validate", {"session_id": "v1", "path": path})
            err = caught.value
            assert err.code == "forbidden", (path, err)
            assert err.data["reason"] in CONFINEMENT_REASONS, (path, err.data)
            assert SECRET not in err.message and SECRET not in json.dumps(err.data)
            refused.append((path, err.data["reason"]))
        # Existence does not leak: a path that exists and one that does not get the same answer.
        reasons = dict(refused)
        assert reasons["linkdir/secret.json"] == reasons["linkdir/nonexistent.json"]
        assert reasons["../outside/secret.json"] == reasons["../nonexistent.json"]
        assert reasons[str(secret)] == reasons["/nonexistent/secret.json"]
        # The control: paths inside the project (also through a symlink that stays inside) work.
        assert client.call("config.validate", {"session_id": "v1", "path": "inside.json"})["path"] == str(inside)
        assert client.call("config.validate", {"session_id": "v1", "path": str(inside)})["path"] == str(inside)
        assert client.call("config.validate", {"session_id": "v1", "path": "inside-link.json"})["path"] == str(inside)
    assert socket_server.alive()
    if detector:
        assert {p: os.stat(p).st_atime_ns for p in atimes} == atimes, "a file outside the project was read"
    print(f"paths tried and refused: {len(refused)}; atime detector {'on' if detector else 'unavailable'}")


def test_the_refusal_comes_before_any_open(tmp_path):
    """In process: ``confine`` never opens the target (a FIFO with no writer would block a plain open)."""
    from castor.adapters.fs import confine
    from castor.messages.errors import Forbidden

    root = tmp_path / "root"
    root.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (root / "f").symlink_to(fifo)
    for value in ("f", str(fifo), "../fifo"):
        with pytest.raises(Forbidden):
            confine(root, value, allow_absolute=True)
    # (an open would block: the test's timeout, not a wall-clock assert, is what catches it)
    os.mkfifo(root / "inner")
    assert confine(root, "inner") == root.resolve() / "inner"  # inside: resolved, still not opened


def test_a_projects_materia_config_linked_outside_is_never_read_nor_copied(socket_server, tmp_path):
    """`.pi/pi-materia.json` is a link to a file outside the project: config.validate refused it,
    but loadout.list and cast.start read it and loadout.set copied its content into the project.
    Every verb now refuses it (invalid_config, `path-escapes-project`) and reads nothing."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    secret = _secret_config(tmp_path / "outside" / "secret.json")
    (project / ".pi" / "pi-materia.json").symlink_to(secret)
    detector = _atime_detects_reads(tmp_path)
    atime = _age_atime(secret)
    with socket_server.client() as client:
        client.call("session.open", {"session_id": "l1", "cwd": str(project)})
        for method, params in (("loadout.list", {}), ("loadout.set", {"name": "build"}),
                               ("cast.start", {"request": "go"})):
            with pytest.raises(CastorError) as caught:
                client.call(method, {"session_id": "l1", "cwd": str(project), **params})
            assert caught.value.code == "invalid_config", (method, caught.value)
            assert "path-escapes-project" in json.dumps(caught.value.data), (method, caught.value.data)
            assert SECRET not in caught.value.message and SECRET not in json.dumps(caught.value.data)
    assert (project / ".pi" / "pi-materia.json").is_symlink(), "the link was replaced by a copy"
    if detector:
        assert os.stat(secret).st_atime_ns == atime, "the file outside the project was read"
