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

    FrozenClock(monkeypatch)  # within one back-off: only a change makes a call read it again
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


class FrozenClock:
    """The session's clock for its settings' re-read back-off, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from castor.actors.icarus import session as session_module

        self.now = 1000.0
        monkeypatch.setattr(session_module, "_now", lambda: self.now, raising=False)


def test_an_eio_that_clears_with_the_files_stat_unchanged_is_read_at_the_first_call_after_a_short_back_off(
        world, monkeypatch):
    """An ``EIO`` that clears by itself changes nothing a ``stat`` shows, so the file was read again
    only at the session's next open: its settings stayed ignored for the session's life. While the
    last read failed, a call now reads it again once a short back-off has passed
    (``SETTINGS_RETRY_S``; one read per back-off at most, however many calls), and the settings are
    the session's from that call on."""
    from castor.actors.icarus.session import SETTINGS_RETRY_S

    clock = FrozenClock(monkeypatch)
    world.write_project({"timeoutMs": 4321})
    refused = RefusedFile(monkeypatch, str(world.project_path), "EIO")
    rt = world.runtime()
    _, sess = world.open(rt, trusted=True)
    assert sess.config()["config"]["warnings"] == ["project settings ignored: unreadable (OSError)"]
    for _ in range(3):  # still failing: one read per back-off, never one per call
        for _ in range(5):
            sess.config()
            sess.tool("fabric_brief", {})
        clock.now += SETTINGS_RETRY_S
    sess.config()
    assert refused.reads == 4, refused.reads
    assert sess.config()["config"]["warnings"] == ["project settings ignored: unreadable (OSError)"]

    refused.errno_name = None  # the fault clears; the file's stat is what it was
    assert sess.config()["config"]["effective"]["timeoutMs"] == 10000  # within the back-off: not yet
    clock.now += SETTINGS_RETRY_S
    config = sess.config()["config"]
    assert config["effective"]["timeoutMs"] == 4321 and config["sources"]["timeoutMs"] == "project"
    assert config["warnings"] == [] and sess.settings.timeout_ms == 4321
    reads = refused.reads
    clock.now += 10 * SETTINGS_RETRY_S
    sess.config()
    assert refused.reads == reads, "read, nothing refused: no more re-reads"
