"""A settings file the storage would not read (``EACCES``, ``EIO``: the file's own fault, not
castor's) is ignored with a warning while it stays so, and read again -- with the precedence of a
session's start -- at the first call after it changed (a ``chmod`` that gives it back, a repaired
file); while it does not change no call reads it (a ``stat`` each at most), and each distinct cause
is said once, not per call. Real sessions over the reference backend; the refusal is
``settings_store.read_regular_file`` refusing the one file (castor runs as root here, whom no
permission stops)."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from castor.adapters.icarus import settings_store

pytestmark = pytest.mark.timeout(60)


class RefusedFile:
    """``settings_store.read_regular_file`` refusing one path with ``errno_name`` while ``refusing``;
    counts the reads of that path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: str, errno_name: str) -> None:
        self.path = path
        self.errno_name: str | None = errno_name
        self.reads = 0
        real = settings_store.read_regular_file

        def read(target: Any, *args: Any, **kwargs: Any) -> Any:
            if os.fspath(target) == self.path:
                self.reads += 1
                if self.errno_name is not None:
                    code = getattr(errno, self.errno_name)
                    raise OSError(code, os.strerror(code), self.path)
            return real(target, *args, **kwargs)

        monkeypatch.setattr(settings_store, "read_regular_file", read)


def test_a_project_file_refused_then_given_back_is_read_at_the_next_call_and_said_once_per_cause(world,
                                                                                                monkeypatch):
    from loguru import logger

    world.write_project({"timeoutMs": 4321, "contextDisplay": False})
    refused = RefusedFile(monkeypatch, str(world.project_path), "EACCES")
    os.chmod(world.project_path, 0)
    said: list[str] = []
    sink = logger.add(lambda m: said.append(m.record["message"]), level="WARNING",
                      filter=lambda r: "settings" in r["message"])
    try:
        rt = world.runtime()
        _, sess = world.open(rt, trusted=True)
        config = sess.config()["config"]
        assert config["effective"]["timeoutMs"] == 10000  # the global value: the project's is ignored
        assert config["warnings"] == ["project settings ignored: unreadable (PermissionError)"]
        for _ in range(20):  # unchanged: no call reads it again, none says it again
            sess.config()
            sess.tool("fabric_brief", {})
        assert refused.reads == 1
        assert sess.config()["config"]["warnings"] == ["project settings ignored: unreadable (PermissionError)"]

        refused.errno_name = "EIO"  # a new cause (the file touched: a new ctime)
        os.chmod(world.project_path, 0o600)
        assert sess.config()["config"]["warnings"] == ["project settings ignored: unreadable (OSError)"]
        sess.config()
        assert refused.reads == 2

        refused.errno_name = None  # readable again
        os.chmod(world.project_path, 0o644)
        config = sess.config()["config"]
        assert config["effective"]["timeoutMs"] == 4321 and config["sources"]["timeoutMs"] == "project"
        assert config["effective"]["contextDisplay"] is False and config["warnings"] == []
        assert sess.settings.timeout_ms == 4321  # what the session's calls use from now on
        sess.config()
        assert refused.reads == 3
    finally:
        logger.remove(sink)
    causes = [m for m in said if "ignored" in m]
    assert len(causes) == 2, said  # PermissionError once, OSError once
