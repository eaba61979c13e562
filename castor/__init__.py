"""castor: a supervised actor runtime for materia casts and the Icarus memory bridge.

The names in ``__all__`` are the embedding API: what a program that runs castor in its own
process (rather than through the ``castor`` command) needs — the runtime and its settings, what a
session is opened with, the actor system, the endpoint client, and the typed errors every call
may raise. Those names are stable; anything else is reached through its module and may move.

They are loaded on first use, not when ``castor`` is imported: the command line, the Icarus worker
program and every test import this package, and none of them should pay for the runtime (or risk
an import cycle through it) unless it asks for one of these names.
"""

from __future__ import annotations

import codecs
from importlib import import_module
from typing import TYPE_CHECKING, Any

from castor.version import __version__ as __version__

# The codecs castor uses besides UTF-8 and ASCII (escaping a name a message shows; JavaScript's
# UTF-16 code units) are looked up now, once: a codec's first use imports its module from disk,
# which a process out of file descriptors cannot do -- and the typed error saying so is built
# with them.
for _codec in ("unicode_escape", "utf-16-le"):
    codecs.lookup(_codec)
del _codec

_ERRORS = "castor.messages.errors"

_WHERE: dict[str, str] = {
    "Runtime": "castor.runtime",
    "build_runtime": "castor.composition",
    "RuntimeSettings": "castor.runtime",
    "SessionInfo": "castor.runtime",
    "HarnessLink": "castor.runtime",
    "ActorSystem": "castor.supervision.system",
    "Client": "castor.client",
    "ErrorCode": _ERRORS,
    "CastorError": _ERRORS,
    "ActorCrashed": _ERRORS,
    "ActorStopped": _ERRORS,
    "Cancelled": _ERRORS,
    "Conflict": _ERRORS,
    "Forbidden": _ERRORS,
    "Internal": _ERRORS,
    "InvalidConfig": _ERRORS,
    "InvalidFrame": _ERRORS,
    "InvalidMessage": _ERRORS,
    "InvalidParams": _ERRORS,
    "MailboxFull": _ERRORS,
    "NotFound": _ERRORS,
    "Retired": _ERRORS,
    "StorageUnavailable": _ERRORS,
    "Timeout": _ERRORS,
    "Unauthenticated": _ERRORS,
    "UnknownMethod": _ERRORS,
    "WorkerCrashed": _ERRORS,
    "WorkerRetired": _ERRORS,
}
"""Where each public name is defined. ``__all__`` below lists the same names (tests/test_public_surface.py
pins both)."""

__all__ = [
    "ActorCrashed",
    "ActorStopped",
    "ActorSystem",
    "Cancelled",
    "CastorError",
    "Client",
    "Conflict",
    "ErrorCode",
    "Forbidden",
    "HarnessLink",
    "Internal",
    "InvalidConfig",
    "InvalidFrame",
    "InvalidMessage",
    "InvalidParams",
    "MailboxFull",
    "NotFound",
    "Retired",
    "Runtime",
    "RuntimeSettings",
    "SessionInfo",
    "StorageUnavailable",
    "Timeout",
    "Unauthenticated",
    "UnknownMethod",
    "WorkerCrashed",
    "WorkerRetired",
    "build_runtime",
]

if TYPE_CHECKING:  # static checkers see real imports; at run time __getattr__ loads them lazily
    from castor.client import Client
    from castor.composition import build_runtime
    from castor.messages.errors import (
        ActorCrashed,
        ActorStopped,
        Cancelled,
        CastorError,
        Conflict,
        ErrorCode,
        Forbidden,
        Internal,
        InvalidConfig,
        InvalidFrame,
        InvalidMessage,
        InvalidParams,
        MailboxFull,
        NotFound,
        Retired,
        StorageUnavailable,
        Timeout,
        Unauthenticated,
        UnknownMethod,
        WorkerCrashed,
        WorkerRetired,
    )
    from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
    from castor.supervision.system import ActorSystem


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (then it is an ordinary attribute)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'castor' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
