"""The error model: every failure that crosses an actor or wire boundary.

Each error carries a stable string ``code`` (the wire contract,
docs/protocol.md 'Errors'), a human ``message`` and optional structured ``data``.
Codes are never renamed; new ones may be added. ``may_have_started`` tells a
caller whether the work it asked for may already have run (and so must not be
blindly retried).
"""

from __future__ import annotations

import errno
from enum import StrEnum
from typing import Any, ClassVar


class ErrorCode(StrEnum):
    """Stable error codes. The first ten are part of the external contract."""

    INVALID_FRAME = "invalid_frame"
    UNKNOWN_METHOD = "unknown_method"
    INVALID_PARAMS = "invalid_params"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    FORBIDDEN = "forbidden"
    TIMEOUT = "timeout"
    WORKER_RETIRED = "worker_retired"
    WORKER_CRASHED = "worker_crashed"
    INTERNAL = "internal"
    # Runtime additions (documented in docs/supervision.md).
    ACTOR_STOPPED = "actor_stopped"
    ACTOR_CRASHED = "actor_crashed"
    ACTOR_RETIRED = "actor_retired"
    MAILBOX_FULL = "mailbox_full"
    CANCELLED = "cancelled"
    INVALID_MESSAGE = "invalid_message"
    INVALID_CONFIG = "invalid_config"
    UNAUTHENTICATED = "unauthenticated"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    STATE_CORRUPT = "state_corrupt"


class CastorError(Exception):
    """Base of every typed castor error."""

    code: ErrorCode = ErrorCode.INTERNAL
    #: The message is someone else's text that may quote a prompt or a memory (an Icarus backend's
    #: own error): it goes to the caller, never into castor's log (which shows the code, reason and
    #: error id instead).
    private_message: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | str | None = None,
        data: dict[str, Any] | None = None,
        may_have_started: bool | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = ErrorCode(code)
        self.message = message
        self.data = dict(data or {})
        if may_have_started is not None:
            self.data["may_have_started"] = may_have_started

    @property
    def may_have_started(self) -> bool | None:
        return self.data.get("may_have_started")

    def to_wire(self) -> dict[str, Any]:
        """The ``{code, message, data?}`` map of the msgpack-rpc error slot. Its message is cut at
        :data:`MAX_WIRE_MESSAGE_CHARS` and every string in its data at :data:`MAX_WIRE_DATA_CHARS`:
        an error may echo what the peer sent (an unknown method, an id), and the peer may have sent
        megabytes -- an answer repeating them would be larger than the peer may read."""
        wire: dict[str, Any] = {"code": str(self.code), "message": cut_text(self.message, MAX_WIRE_MESSAGE_CHARS)}
        if self.data:
            wire["data"] = _cut_strings(self.data)
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> CastorError:
        """Rebuild the most specific error class for a wire error map. Its message is cut at
        :data:`MAX_WIRE_MESSAGE_CHARS`, as castor cuts its own: a peer's error text goes on into
        castor's log lines and a cast's failure reason, and it may have sent megabytes of it."""
        raw_data = wire.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        try:
            code = ErrorCode(wire.get("code", "internal"))
        except ValueError:  # a peer's own code: keep it, classify as internal
            data = {**data, "wire_code": cut_text(str(wire.get("code")), MAX_WIRE_CODE_CHARS)}
            code = ErrorCode.INTERNAL
        klass = _BY_CODE.get(code, CastorError)
        err = klass.__new__(klass)
        CastorError.__init__(err, cut_text(str(wire.get("message", "")), MAX_WIRE_MESSAGE_CHARS), code=code, data=data)
        return err

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!s}, message={self.message!r})"


class InvalidFrame(CastorError):
    """A frame that is not a well-formed msgpack-rpc message; the connection may be closed."""

    code = ErrorCode.INVALID_FRAME


class UnknownMethod(CastorError):
    """No method of that name is registered at the endpoint."""

    code = ErrorCode.UNKNOWN_METHOD


class InvalidParams(CastorError):
    """A request's parameters failed validation (``data`` says which field and why)."""

    code = ErrorCode.INVALID_PARAMS


class NotFound(CastorError):
    """The named thing (a session, cast, actor path, file) does not exist."""

    code = ErrorCode.NOT_FOUND


class Conflict(CastorError):
    """The request clashes with the current state (for example a second cast while one runs)."""

    code = ErrorCode.CONFLICT


class Forbidden(CastorError):
    """The caller may not do this (trust, ownership, or a path outside the project)."""

    code = ErrorCode.FORBIDDEN


class Unauthenticated(CastorError):
    """The connection has not presented the endpoint's token (``runtime.hello {token}``)."""

    code = ErrorCode.UNAUTHENTICATED


class Timeout(CastorError):
    """A deadline passed. ``may_have_started`` says whether the work began."""

    code = ErrorCode.TIMEOUT




class WorkerCrashed(CastorError):
    """The Icarus worker process exited while calls were pending (``data.exit_code``)."""

    code = ErrorCode.WORKER_CRASHED


class Internal(CastorError):
    """A bug or an unexpected failure inside castor; the message carries no private data."""

    code = ErrorCode.INTERNAL


class ActorStopped(CastorError):
    """The target actor stopped or crashed before (or while) handling the request."""

    code = ErrorCode.ACTOR_STOPPED


class ActorCrashed(CastorError):
    """The target actor crashed while handling this request (the work may have started).

    The original exception is the ``__cause__``; ``data.error_type`` names its
    class. Its text is not copied (it may hold private data). Because this is
    a CastorError, a caller that does not catch it answers its own caller with
    it instead of crashing in turn: crashes do not cascade along asks.
    """

    code = ErrorCode.ACTOR_CRASHED


class Retired(CastorError):
    """The target actor retired; its queued and in-flight requests are rejected."""

    code = ErrorCode.ACTOR_RETIRED

    @property
    def reason(self) -> str:
        return str(self.data.get("reason", ""))


class WorkerRetired(Retired):
    """The Icarus worker retired (timeout, cancellation): queued calls are rejected, never run."""

    code = ErrorCode.WORKER_RETIRED


class MailboxFull(CastorError):
    """A bounded mailbox refused a message (overflow policy: reject)."""

    code = ErrorCode.MAILBOX_FULL


#: errnos that mean the process (or the system) has no file descriptor or buffer to spare: the
#: process's ``ulimit -n`` (``EMFILE``), the system's table (``ENFILE``), kernel memory.
FD_EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def out_of_file_descriptors(exc: OSError, *, may_have_started: bool | None = None) -> MailboxFull:
    """What a caller gets when castor has no file descriptor for its work (a connection, a
    session's worker): ``mailbox_full`` with ``data.reason: out_of_file_descriptors`` and the
    errno's name -- retryable, once some connections or sessions have closed."""
    name = errno.errorcode.get(exc.errno or -1, "EUNKNOWN")
    return MailboxFull(f"castor is out of file descriptors ({name}: {exc.strerror}); "
                       "retry once some connections or sessions have closed",
                       data={"reason": "out_of_file_descriptors", "errno": name}, may_have_started=may_have_started)


class Cancelled(CastorError):
    """The caller cancelled the work before it finished."""

    code = ErrorCode.CANCELLED


class InvalidMessage(CastorError):
    """A message could not be encoded, decoded or validated."""

    code = ErrorCode.INVALID_MESSAGE


class InvalidConfig(CastorError):
    """A configuration file or value is malformed or breaks a rule (``data`` says where)."""

    code = ErrorCode.INVALID_CONFIG


class StorageUnavailable(CastorError):
    """The file system refused a write or read castor needs (disk full, quota, I/O error,
    read-only, permission): the environment's fault, not castor's. ``data.errno`` is the errno
    name (``ENOSPC``...), ``data.path`` the path (relative to the project where possible).
    Retrying is useless until the storage is fixed."""

    code = ErrorCode.STORAGE_UNAVAILABLE


_BY_CODE: dict[ErrorCode, type[CastorError]] = {
    klass.code: klass
    for klass in (
        InvalidFrame, UnknownMethod, InvalidParams, NotFound, Conflict, Forbidden,
        Timeout, WorkerRetired, WorkerCrashed, Internal, ActorStopped, ActorCrashed, Retired,
        MailboxFull, Cancelled, InvalidMessage, InvalidConfig, StorageUnavailable,
    )
}
_BY_CODE[ErrorCode.UNAUTHENTICATED] = Unauthenticated


MAX_WIRE_MESSAGE_CHARS = 4096
"""An error's message on the wire is cut here (see :meth:`CastorError.to_wire`)."""
MAX_WIRE_DATA_CHARS = 16384
"""Every string in an error's data on the wire is cut here (see :meth:`CastorError.to_wire`)."""
MAX_WIRE_CODE_CHARS = 64
"""A peer's own error code that castor does not know is kept (``data.wire_code``) cut here."""


def cut_text(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... (cut: {len(text)} characters)"




def _cut_strings(value: Any, depth: int = 0) -> Any:
    """``value`` with every string in it cut at :data:`MAX_WIRE_DATA_CHARS` (maps and lists are
    walked, a few levels deep; what is deeper is passed as it is)."""
    if isinstance(value, str):
        return cut_text(value, MAX_WIRE_DATA_CHARS)
    if depth >= 4:
        return value
    if isinstance(value, dict):
        return {key: _cut_strings(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_strings(item, depth + 1) for item in value]
    return value
