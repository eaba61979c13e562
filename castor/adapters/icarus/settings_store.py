"""Reading and writing Pi ``settings.json`` files for the Icarus bridge.

Reads are tolerant: a missing, unreadable or malformed file becomes a
:class:`SettingsLayer` with ``doc=None`` and an ``error`` (later a warning);
reading never raises for bad files (a file castor had no descriptor to open is
no bad file: ``storage_unavailable``). Only a regular file of at most 4 MiB is
read (a FIFO or ``/dev/zero`` is unreadable at once, never a hang), strict
JSON only (``NaN``/``Infinity`` are malformed: Pi could not read them back).

Writes are a locked read-modify-write:

- **Lock.** ``<file>.lock`` held with ``filelock.SoftFileLock`` (an ``O_EXCL``
  marker file removed on release). This is mutually exclusive with Pi's own
  ``proper-lockfile`` convention, which ``mkdir``\\ s the same path: while Pi
  holds its directory we cannot create our marker and wait; while we hold our
  marker Pi's ``mkdir`` fails and Pi waits. A lock path older than
  :data:`STALE_AFTER_S` (Pi's 10 s) is treated as abandoned and removed. Within
  this process a threading lock per path serialises writers first.
- **Read** under the lock: a missing file is ``{}``; malformed JSON or a
  top-level value that is not an object raises :class:`SettingsFileMalformed`
  and the file is left byte-for-byte unchanged.
- **Write** ``json.dumps(doc, indent=2) + "\\n"`` to a temp file in the same
  directory, fsync, ``os.replace``, fsync the directory: readers see the old or
  the new file, never a torn one. A symlinked file is written through (its
  target is replaced, the link stays) -- a project's only while that target is
  inside the project (``confine_to``). Unrelated keys are preserved because the
  mutation receives the whole current document.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import filelock

from castor.adapters.fs import (
    NO_DESCRIPTOR_ERRNOS,
    UnsafeFile,
    atomic_write_text,
    file_signature,
    is_storage_fault,
    make_dirs,
    read_regular_file,
    storage_unavailable,
)
from castor.domain import paths
from castor.domain.icarus.settings import (
    IcarusSettings,
    SettingsDocumentError,
    SettingsLayer,
    resolve_settings,
    settings_paths,
)
from castor.domain.jsontext import loads_strict, well_formed
from castor.messages.errors import ErrorCode, Forbidden, InvalidConfig, Timeout

STALE_AFTER_S = 10.0
LOCK_TIMEOUT_S = 5.0
_POLL_S = 0.02

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


class SettingsFileMalformed(InvalidConfig):
    """The settings file is not a JSON object; it was not overwritten."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"refusing to overwrite {path}: {reason}",
                         data={"path": path, "reason": "malformed_settings"})


class SettingsLockTimeout(Timeout):
    """Another writer held ``<file>.lock`` for longer than the lock timeout."""

    def __init__(self, path: str, waited_s: float) -> None:
        super().__init__(f"settings lock {path}.lock busy for {waited_s:.1f}s; nothing was written",
                         code=ErrorCode.TIMEOUT, data={"path": path, "reason": "settings_locked"},
                         may_have_started=False)


# --------------------------------------------------------------------------- reads

MAX_SETTINGS_BYTES = 4 * 1024 * 1024
"""A settings file larger than this is unreadable: it is hand-edited JSON."""


class _Unusable(Exception):
    """A settings file that exists but cannot be used (the message says why)."""


class _Unsafe(_Unusable):
    """A settings file another user owns, or every user may write (``owned`` reads only)."""


def _parse(path: str, *, owned: bool = False, storage_faults: bool = False) -> dict[str, Any]:
    """The file's JSON object. ``FileNotFoundError`` if missing; ``_Unusable(reason)`` if it is not
    a regular file of at most MAX_SETTINGS_BYTES holding one strict JSON object (no NaN or
    Infinity: Pi's ``JSON.parse`` would refuse them), or (``owned``) if another user owns it or
    every user may write it. Lone surrogates become U+FFFD. ``storage_faults``: a read the storage
    refused (``is_storage_fault``: failing, forbidden, no descriptor left) goes up as the
    ``OSError`` -- the file may be fine -- instead of making it unusable."""
    try:
        text = read_regular_file(path, MAX_SETTINGS_BYTES, owned=owned).decode("utf-8")
    except FileNotFoundError:
        raise
    except UnsafeFile as exc:
        raise _Unsafe(str(exc)) from None
    except OSError as exc:
        if storage_faults and is_storage_fault(exc):
            raise
        raise _Unusable(f"unreadable ({type(exc).__name__})") from None
    except UnicodeDecodeError as exc:
        raise _Unusable(f"unreadable ({type(exc).__name__})") from None
    except ValueError as exc:  # not a regular file, too large
        raise _Unusable(f"unreadable ({exc})") from None
    try:
        doc = loads_strict(text)
        if not isinstance(doc, dict):
            raise _Unusable("top level is not an object")
        # recursive too: nesting deep enough for the parser can still overflow it
        checked: dict[str, Any] = well_formed(doc)
    except (ValueError, RecursionError):
        raise _Unusable("not valid JSON") from None
    return checked



def read_layer(path: str, scope: Literal["project", "global"]) -> SettingsLayer:
    """Tolerant read of one settings file. Each chooses the Icarus worker's Python and package
    (the global one for every session, a trusted project's for its own): a file another user
    owns, or every user may write, is ignored with the reason -- the agent directory's variable
    naming a shared directory, or a project another user may write in (trust covers the
    project's owner, not whoever else could write its files). A file castor had no file
    descriptor to open (``EMFILE``, ``ENFILE``) is no bad file: ``storage_unavailable``
    (``data.errno``), never ignored."""
    try:
        doc = _parse(path, owned=True, storage_faults=True)
    except FileNotFoundError:
        return SettingsLayer(scope=scope, path=path)
    except _Unusable as exc:
        return SettingsLayer(scope=scope, path=path, error=str(exc))
    except OSError as exc:
        if exc.errno in NO_DESCRIPTOR_ERRNOS:
            # The process's shortage, not the file's: ignored, the layer would leave the session
            # without what it configures (Icarus itself) for its whole life, and no one told.
            raise storage_unavailable(exc, path=path, action="read the settings") from None
        # The file's own storage refused it (EACCES, EIO): that may pass. What tells this version
        # of the file apart is kept, so a session reads it again once it changes (a chmod, a repair).
        return SettingsLayer(scope=scope, path=path, error=f"unreadable ({type(exc).__name__})",
                             refused=True, signature=file_signature(path))
    return SettingsLayer(scope=scope, path=path, doc=doc)


def load_layers(cwd: str, *, trusted: bool, env: Mapping[str, str] | None = None,
                home: str | None = None) -> tuple[SettingsLayer, SettingsLayer]:
    """(project, global) layers. An untrusted project's file is never opened."""
    env = os.environ if env is None else env
    home = home or os.path.expanduser("~")
    project_path, global_path = settings_paths(os.path.abspath(cwd), env, home)
    project = read_layer(project_path, "project") if trusted else SettingsLayer(scope="project", path=project_path)
    return project, read_layer(global_path, "global")


def load_settings(cwd: str, *, trusted: bool, env: Mapping[str, str] | None = None,
                  home: str | None = None) -> IcarusSettings:
    """Effective settings for a session in ``cwd``; never raises for bad files (only when castor
    has no file descriptor to read one: ``storage_unavailable``)."""
    env = dict(os.environ if env is None else env)
    home = home or os.path.expanduser("~")
    project, global_ = load_layers(cwd, trusted=trusted, env=env, home=home)
    return resolve_settings(project=project, global_=global_, trusted=trusted, env=env,
                            cwd=os.path.abspath(cwd), home=home, exists=os.path.isdir)


# --------------------------------------------------------------------------- lock

def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(path, threading.Lock())


def _remove_if_stale(lock_path: str) -> None:
    try:
        age = time.time() - os.stat(lock_path).st_mtime
    except FileNotFoundError:
        return
    if age < STALE_AFTER_S:
        return
    try:
        if os.path.isdir(lock_path):
            os.rmdir(lock_path)
        else:
            os.unlink(lock_path)
    except OSError:
        pass  # someone else removed or re-took it; the next attempt decides


def _acquire(lock_path: str, timeout_s: float) -> filelock.SoftFileLock:
    deadline = time.monotonic() + timeout_s
    while True:
        lock = filelock.SoftFileLock(lock_path, blocking=False)
        try:
            lock.acquire()
            return lock
        except (filelock.Timeout, IsADirectoryError, FileExistsError):
            pass  # held by another writer (ours: a file; Pi's: a directory)
        except PermissionError:
            if not os.path.lexists(lock_path):
                # No lock there: the directory refused the lock file itself (a permission taken
                # away). No writer will release that; waiting out the timeout only to say
                # "busy" hid the reason. The storage's refusal, as the write's would be.
                raise
            # an existing lock file castor may not open: held by another writer
        _remove_if_stale(lock_path)
        if time.monotonic() >= deadline:
            raise SettingsLockTimeout(lock_path[: -len(".lock")], timeout_s)
        time.sleep(_POLL_S)


# --------------------------------------------------------------------------- writes

def _read_for_update(path: str, *, owned: bool) -> dict[str, Any]:
    """The document a write starts from. A read the storage refused is its ``OSError`` (the caller
    answers ``storage_unavailable``), never "malformed": the file is left as it is either way."""
    try:
        return _parse(path, owned=owned, storage_faults=True)
    except FileNotFoundError:
        return {}
    except _Unsafe as exc:
        # The reads ignore such a file; written back, it would become castor's user's own, with
        # whatever the other user put in it (a ``python``) read from the next session on.
        raise Forbidden(f"refusing to write {path}: {exc}",
                        data={"path": path, "reason": "unsafe_permissions"}) from None
    except _Unusable as exc:
        raise SettingsFileMalformed(path, str(exc)) from None


def _atomic_write(path: str, text: str) -> None:
    atomic_write_text(path, text, keep_mode=True)


def update_settings(path: str, mutate: Callable[[dict[str, Any]], dict[str, Any]],
                    *, lock_timeout_s: float = LOCK_TIMEOUT_S, confine_to: str | None = None,
                    owned: bool = False) -> dict[str, Any]:
    """Locked read-modify-write of one settings file; returns the written document.

    ``mutate`` gets the current document (``{}`` when missing) and returns the
    new one; if it raises, nothing is written. Raises
    :class:`SettingsFileMalformed` (file untouched), :class:`SettingsLockTimeout`,
    or ``InvalidConfig`` when ``mutate`` rejects the document; the ``OSError`` of a read or write
    the storage refused (file untouched). ``confine_to`` (a project's
    directory, for its ``.pi/settings.json``): the file's real location must be inside it --
    a project's link to a file elsewhere is ``Forbidden``, never written through (the user's
    own global settings may be a link into their dotfiles: that one is). ``owned`` (the global
    file, which the reads check the same way): a file another user owns, or every user may write,
    is ``Forbidden`` (``unsafe_permissions``) and left as it is.
    """
    path = os.path.abspath(path)
    if confine_to is not None:
        real = os.path.realpath(path)
        if not paths.inside(os.path.realpath(confine_to), real):
            raise Forbidden(f"{path} leads outside the project ({real}); castor does not write through it",
                            data={"reason": "symlink", "path": path})
    make_dirs(os.path.dirname(path))
    with _thread_lock(path):
        lock = _acquire(path + ".lock", lock_timeout_s)
        try:
            doc = _read_for_update(path, owned=owned)
            try:
                new_doc = mutate(doc)
            except SettingsDocumentError as exc:
                raise SettingsFileMalformed(path, str(exc)) from None
            # A symlinked settings file (dotfiles) is written through: replacing the link with a
            # regular file would silently detach it from what the user edits.
            _atomic_write(os.path.realpath(path), json.dumps(new_doc, indent=2, ensure_ascii=False) + "\n")
            return new_doc
        finally:
            lock.release()
