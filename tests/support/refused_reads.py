"""A module's ``read_regular_file`` refused with one errno, for as long as a test says: the way a
process out of file descriptors (``EMFILE``, ``ENFILE``) or a failing disk meets a file."""

from __future__ import annotations

import errno
import os
from types import ModuleType
from typing import Any

import pytest


def refuse_reads_in(monkeypatch: pytest.MonkeyPatch, module: ModuleType, errno_name: str) -> dict[str, bool]:
    """``module.read_regular_file`` raises ``OSError(errno.<errno_name>)`` naming the file while the
    returned switch's ``"on"`` is true (it starts true); set it false to let reads through again."""
    real = module.read_regular_file
    refusing = {"on": True}

    def read_refused(target: Any, *args: Any, **kwargs: Any) -> Any:
        if refusing["on"]:
            code = getattr(errno, errno_name)
            raise OSError(code, os.strerror(code), os.fspath(target))
        return real(target, *args, **kwargs)

    monkeypatch.setattr(module, "read_regular_file", read_refused)
    return refusing
