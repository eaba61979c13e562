"""No code from outside ``icarusDir`` ever runs in the Icarus worker.

A module of the configured package that is a symlink to a file outside the directory (or that
reaches outside through a symlinked sub-directory, a symlinked ``__init__.py`` or a symlinked
``__pycache__``) is refused by the worker *before* it is imported: a marker file its top level
would write never appears, and the caller gets ``forbidden`` (reason ``outside_package``). A
symlink that stays inside the directory is fine. Real worker subprocesses; the endpoint case is a
real ``python -m castor serve`` over a Unix socket.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from castor.adapters.icarus.launch import build_launch
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id
from castor.domain.icarus.settings import IcarusSettings
from castor.domain.icarus.worker_protocol import IcarusModuleRefused, reply_result
from castor.messages.errors import CastorError, ErrorCode
from tests.security import conftest as security

HOOKS = '''
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


def uses(name):
    import importlib
    return importlib.import_module("icarus." + name).VALUE


def on_session_start(**kwargs):
    return None
'''


def evil_module(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('outside code ran')\nVALUE = 'evil'\n"


class Package:
    """A package in ``tmp/pkg/icarus`` and, outside it, ``tmp/outside`` with modules that leave a marker."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "pkg" / "icarus"
        self.root.mkdir(parents=True)
        (self.root / "__init__.py").write_text("")
        (self.root / "hooks.py").write_text(HOOKS)
        self.outside = tmp / "outside"
        self.outside.mkdir()
        self.marker = tmp / "MARKER"

    def evil_file(self, name: str = "evil.py") -> Path:
        path = self.outside / name
        path.write_text(evil_module(self.marker))
        return path

    def worker(self) -> WorkerProcess:
        settings = IcarusSettings(icarus_dir=str(self.root), fabric_dir=str(self.tmp / "fabric"), python=sys.executable)
        return WorkerProcess(build_launch(settings, cwd=str(self.tmp)))


def call(worker: WorkerProcess, module: str, function: str, *args):
    reply = worker.call(next_request_id(), module, function, list(args), {}, time.monotonic() + 30)
    return reply_result(reply, f"{module}.{function}")


@pytest.fixture
def package(tmp_path):
    return Package(tmp_path)


@pytest.fixture
def worker(package):
    w = package.worker()
    yield w
    w.kill_tree("test done")


def assert_refused(worker: WorkerProcess, package: Package, module: str, function: str, *args) -> None:
    with pytest.raises(IcarusModuleRefused) as info:
        call(worker, module, function, *args)
    error = info.value
    assert error.code == ErrorCode.FORBIDDEN and error.data["reason"] == "outside_package"
    assert error.may_have_started is False
    assert not package.marker.exists(), "code from outside icarusDir ran"
    assert call(worker, "hooks", "echo", 1) == {"args": [1], "kwargs": {}}  # the worker is fine


def test_a_module_symlinked_outside_is_refused_before_import(package, worker):
    (package.root / "tools.py").symlink_to(package.evil_file())
    assert_refused(worker, package, "tools", "fabric_recall", {"query": "q"})
    assert_refused(worker, package, "tools", "fabric_recall", {"query": "q"})  # and again: still refused


def test_an_import_from_inside_the_package_is_refused_too(package, worker):
    (package.root / "evil.py").symlink_to(package.evil_file())
    assert_refused(worker, package, "hooks", "uses", "evil")


def test_a_symlinked_sub_directory_is_refused(package, worker):
    sub = package.outside / "sub"
    sub.mkdir()
    (sub / "__init__.py").write_text(evil_module(package.marker))
    (package.root / "sub").symlink_to(sub, target_is_directory=True)
    assert_refused(worker, package, "hooks", "uses", "sub")


def test_a_symlinked_pycache_is_refused(package, worker):
    """Bytecode from outside would run without its source: a ``__pycache__`` that points out
    refuses the package (its ``__init__`` would be read from there first)."""
    cache = package.outside / "cache"
    cache.mkdir()
    (package.root / "__pycache__").symlink_to(cache, target_is_directory=True)
    with pytest.raises(IcarusModuleRefused) as info:
        call(worker, "hooks", "echo", 1)
    assert info.value.data["module"] == "icarus"
    assert os.listdir(cache) == []  # nothing was read from there or written to it


def test_a_symlinked_init_is_refused_and_nothing_runs(package, worker):
    (package.root / "__init__.py").unlink()
    (package.root / "__init__.py").symlink_to(package.evil_file("init.py"))
    with pytest.raises(IcarusModuleRefused):
        call(worker, "hooks", "echo", 1)
    assert not package.marker.exists()


def test_a_symlink_that_stays_inside_is_allowed(package, worker):
    (package.root / "real_state.py").write_text("VALUE = 'inside'\n")
    (package.root / "state.py").symlink_to(package.root / "real_state.py")
    assert call(worker, "hooks", "uses", "state") == "inside"


@pytest.fixture
def tree_under_test(monkeypatch):
    """``castor serve`` from the tree these tests belong to (not whichever castor is installed)."""
    from tests.security import conftest

    plain = conftest.serve_env
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(conftest, "serve_env", lambda tmp: {**plain(tmp), "PYTHONPATH": root})


@pytest.mark.timeout(90)
def test_the_harness_sees_forbidden_through_the_endpoint(package, tmp_path, tree_under_test):
    """The user's path: a Fabric tool call from a msgpack-rpc client to ``castor serve``."""
    (package.root / "tools.py").symlink_to(package.evil_file())
    home = tmp_path / "home"
    (home / "agent").mkdir(parents=True)
    (home / "agent" / "settings.json").write_text(json.dumps({"piIcarusHook": {
        "icarusDir": str(package.root), "python": sys.executable, "fabricDir": str(tmp_path / "fabric")}}))
    project = tmp_path / "project"
    project.mkdir()
    server = security.SocketServer(tmp_path)  # runs this tree's castor (see tree_under_test)
    try:
        with server.client() as client:
            client.call("session.open", {"session_id": "s1", "cwd": str(project), "trusted": False,
                                         "flags": {"harness": "pi", "has_agent_settled": True}})
            with pytest.raises(CastorError) as info:
                client.call("icarus.tool", {"session_id": "s1", "name": "fabric_recall",
                                            "params": {"query": "q"}, "tool_call_id": "t1"})
            assert info.value.code == ErrorCode.FORBIDDEN
            assert info.value.data.get("reason") == "outside_package"
            client.call("session.close", {"session_id": "s1"})
    finally:
        server.stop()
    assert not package.marker.exists(), "code from outside icarusDir ran"
    assert os.listdir(package.outside) == ["evil.py"]
