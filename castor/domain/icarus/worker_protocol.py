"""The worker's JSON-lines protocol, as pure rules shared by the adapter and the actor.

Request ``{id, module, function, args, kwargs}``; reply ``{id, ok: true, result}``
or ``{id, ok: false, error, traceback}``. The worker program itself
(``castor.adapters.icarus.worker_program``) must stay import-free of castor, so
it carries its own copy of :data:`ALLOWED_MODULES`; a test pins the two together.
"""

from __future__ import annotations

import errno
import signal
from typing import Any

from castor.messages.errors import CastorError, ErrorCode

ALLOWED_MODULES: tuple[str, ...] = ("hooks", "tools", "state", "obsidian", "parsing")
_ERRNO_NAMES = frozenset(errno.errorcode.values())
#: What a path setting names, in an unusable setting's message ("point SETTING at ..."): ``fabricDir``
#: a directory, ``stateDbPath`` a database file.
_KEPT_IN = {"stateDbPath": "a database file"}


class IcarusCallError(CastorError):
    """The backend function raised; the worker is fine. ``data.traceback`` is diagnostic only."""

    code = ErrorCode.INTERNAL
    private_message = True  # the backend's text: it may quote the query or a memory


class IcarusStorageFault(IcarusCallError):
    """The backend function raised because the storage refused it (a full disk, a read-only
    one, a permission taken away: the worker names the errno): the environment's fault, not
    castor's, so ``storage_unavailable`` rather than ``internal``. The worker is fine."""

    code = ErrorCode.STORAGE_UNAVAILABLE


class IcarusSettingUnusable(IcarusStorageFault):
    """The backend failed because a path setting castor gave it cannot be used (``fabricDir`` a
    dangling symlink, a file, a directory nothing can be created in: the worker looked): the
    environment's fault, ``storage_unavailable`` naming the setting, the path and the errno. Its
    message is castor's own words (never the backend's text, so it may be logged), and it carries
    no traceback."""

    private_message = False


class IcarusModuleRefused(CastorError):
    """A module of the configured package resolves outside ``icarusDir`` (a symlink out, a
    ``__pycache__`` that points elsewhere): the worker refused it before any of its code ran."""

    code = ErrorCode.FORBIDDEN


class IcarusFunctionMissing(CastorError):
    """The configured package has no such function (an older or customised Icarus without a hook
    or a tool): the worker looked it up and called nothing."""

    code = ErrorCode.NOT_FOUND


class WorkerProtocolError(CastorError):
    """The worker's stdout carried a line that is not a protocol reply."""

    code = ErrorCode.INTERNAL


def reply_result(reply: dict[str, Any], target: str) -> Any:
    """The ``result`` of an ``ok`` reply, else :class:`IcarusCallError`.

    The error message is the backend's ``error`` text, or ``"Icarus call
    failed"`` when it is empty. ``may_have_started`` is always true: the
    function ran, at least in part. A reply the worker marks ``refused:
    "outside_package"`` is :class:`IcarusModuleRefused` (``forbidden``, reason
    ``outside_package``, ``may_have_started`` false: the function never ran); one marked ``refused:
    "missing_function"`` is :class:`IcarusFunctionMissing` (``not_found``, reason
    ``missing_function``, ``may_have_started`` false); one castor made for a reply line over its
    bound (``refused: "reply_too_large"``) is :class:`IcarusCallError` with that reason (the
    function ran). One the worker marks
    ``storage: "<ERRNO>"`` (the storage refused the backend) is :class:`IcarusStorageFault`
    (``storage_unavailable``, ``data.errno``); with ``unusable: {setting, path, why}`` as well (a
    path setting the worker found unusable) it is :class:`IcarusSettingUnusable`, worded by castor.
    """
    if reply.get("ok") is True:
        return reply.get("result")
    message = str(reply.get("error") or "") or "Icarus call failed"
    if reply.get("refused") == "outside_package":
        raise IcarusModuleRefused(message, data={"reason": "outside_package", "target": target,
                                                 "module": str(reply.get("module") or "")},
                                  may_have_started=False)
    if reply.get("refused") == "missing_function":
        raise IcarusFunctionMissing(message, data={"reason": "missing_function", "target": target},
                                    may_have_started=False)
    if reply.get("refused") == "reply_too_large":
        raise IcarusCallError(message, data={"reason": "reply_too_large", "target": target}, may_have_started=True)
    storage = reply.get("storage")
    unusable = reply.get("unusable")
    if isinstance(storage, str) and storage in _ERRNO_NAMES and isinstance(unusable, dict):
        setting, path = str(unusable.get("setting") or ""), str(unusable.get("path") or "")
        raise IcarusSettingUnusable(
            f"storage unavailable: the Icarus {setting} {path} {unusable.get('why') or 'cannot be used'} "
            f"({storage}); point {setting} at {_KEPT_IN.get(setting, 'a directory')} the memory can be kept in",
            data={"reason": "backend_error", "target": target, "errno": storage, "setting": setting, "path": path},
            may_have_started=True)
    if isinstance(storage, str) and storage in _ERRNO_NAMES:
        raise IcarusStorageFault(f"storage unavailable: {message}", data={
            "reason": "backend_error", "target": target, "errno": storage,
            "traceback": str(reply.get("traceback") or "")}, may_have_started=True)
    raise IcarusCallError(message, data={"reason": "backend_error", "target": target,
                                         "traceback": str(reply.get("traceback") or "")},
                          may_have_started=True)


def death_words(code: object) -> str:
    """``killed by SIGKILL`` / ``exit code 4`` for a worker's exit status (negative: the signal
    that ended it, as ``subprocess`` reports it); ``""`` when there is none."""
    if not isinstance(code, int) or isinstance(code, bool):
        return ""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"

