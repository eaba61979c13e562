"""Durable cast state: ``<artifactRoot>/<castId>/state.json`` with fencing.

castor persists a cast's state document in its run directory (pi-materia kept
it as a session custom entry; the document's fields are the same,
the engine owns them). The file is::

    {"format": 1, "castId": ..., "revision": N, "incarnation": K,
     "savedAt": "<ISO UTC>", "state": {...the engine's state...}}

Guarantees
----------
- Every ``save`` replaces the file atomically (temp + fsync + rename + dir
  fsync): after ``kill -9`` at any instant the file parses and holds either the
  previous or the new document.
- ``revision`` grows by one on every successful save.
- Fencing: ``claim(cast_id)`` hands out the next *incarnation* number and
  persists it. ``save`` with an incarnation lower than the stored one raises
  :class:`Conflict` (``data.reason == "stale_incarnation"``), so an actor that
  was replaced (a zombie) can never overwrite its successor's state. An
  optional ``expected_revision`` gives compare-and-swap on top.
- Claims and saves of one cast are serialised across threads (a lock) and
  across processes (``flock`` on ``state.lock``).
- ``list_casts`` / ``list_page`` never raise for a bad cast directory: unreadable, corrupt
  or missing state files are returned in ``problems`` with the reason.
- Listing reads the cast index (``cast_index.py``): a page costs ``O(page)`` whatever the
  number of casts, and every row returned was checked against its ``state.json`` (the truth).
  ``save_encoded(..., index=state)`` keeps the index current: the row is rewritten when the
  cast's summary changes (status, resumability, failure reason), a few times per cast.

Failure behaviour
-----------------
- ``load`` of an unknown cast: ``NotFound``; of a corrupt file:
  ``StateCorrupt`` (code ``internal``, ``data.path``).
- Hostile cast ids: ``Forbidden`` (via ``validate_cast_id`` and a ``ConfinedRoot``).
- A state that is not JSON-serialisable raises ``TypeError``/``ValueError``
  and the stored file is unchanged.
- ``state.json`` is read up to :data:`MAX_STATE_BYTES`: a larger file (a sparse file of many
  gigabytes a checkout planted costs no disk) is ``StateCorrupt`` (``load``) or an unreadable row
  (listing), never read into memory. A document over the bound is never written either:
  ``OSError(EFBIG)``, a storage fault, the stored file unchanged.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import re
import shutil
import stat
import threading
import time
import weakref
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from castor._log import logger
from castor.adapters.fs import (
    PRIVATE_FILE_MODE,
    ConfinedRoot,
    atomic_write_bytes,
    foreign_owner,
    is_storage_fault,
    make_private_dir,
    open_without_links,
    read_regular_file,
    split_text,
    stat_signature,
    storage_unavailable,
    temp_target,
)
from castor.adapters.materia import cast_index, pi_materia_runs
from castor.adapters.materia.artifacts import CastArtifacts, validate_cast_id
from castor.adapters.materia.cast_index import ACTIVE, IndexRow, root_signature, signature_text
from castor.domain.jsontext import json_problem
from castor.domain.paths import REASON_SYMLINK
from castor.domain.timestamps import iso_now_ms, iso_utc_ms
from castor.messages.errors import CastorError, Conflict, Forbidden, InvalidParams, NotFound
from castor.ports.cast_storage import DEFAULT_PAGE, EncodedState, StateCorrupt, StateTooLarge

__all__ = [
    "CastListing",
    "CastPage",
    "DEFAULT_PAGE",
    "CastStateStore",
    "CastStatus",
    "CastSummary",
    "StateCorrupt",
    "StoredState",
    "UnreadableCast",
    "cast_status",
    "discard_abandoned_start",
    "discard_unsaved",
    "is_abandoned_start",
    "list_casts",
    "list_page",
    "newest",
]

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
FORMAT = 1
#: The largest ``state.json`` castor reads or writes. A real cast's state is kilobytes to a few
#: megabytes (its outputs live in artifact files; one string from the wire is at most 8 MiB).
MAX_STATE_BYTES = 256 * 1024 * 1024

CastStatus = Literal["active", "awaiting_refinement", "complete", "failed", "aborted", "idle"]


class StoredState(BaseModel):
    """A persisted state document."""

    model_config = ConfigDict(frozen=True)

    cast_id: str
    revision: int
    incarnation: int
    saved_at: str
    state: dict[str, Any]
    #: Why another user may have written this document (``fs.foreign_owner``), as read; else None.
    foreign: str | None = Field(default=None, exclude=True)


class CastSummary(BaseModel):
    """What ``castor casts`` shows for one cast."""

    model_config = ConfigDict(frozen=True)

    cast_id: str
    status: CastStatus
    current_socket: str | None
    updated_at: str
    resumable: bool
    request: str | None = None
    failed_reason: str | None = None
    revivable: bool = False


class UnreadableCast(BaseModel):
    """A cast directory whose state could not be read, and why."""

    model_config = ConfigDict(frozen=True)

    cast_id: str
    path: str
    reason: str
    current_socket: str | None = None  # a pi-materia run's latest socket (pi_materia_runs)
    request: str | None = None  # and its request


class CastListing(BaseModel):
    model_config = ConfigDict(frozen=True)

    casts: list[CastSummary]
    problems: list[UnreadableCast]


MAX_PAGE = 1000


class CastPage(BaseModel):
    """One page of a listing: casts newest id first, then the unreadable directories."""

    model_config = ConfigDict(frozen=True)

    casts: list[CastSummary]
    problems: list[UnreadableCast]
    next_cursor: str | None = None  # pass it back as ``cursor`` for the next page; None: the last page
    total: int = 0  # casts + unreadable directories in the whole listing


def cast_status(state: dict[str, Any]) -> tuple[CastStatus, bool]:
    """Status and resumability of a state document.

    | condition (first match wins)                              | status               |
    |-----------------------------------------------------------|----------------------|
    | ``active`` and socketState ``awaiting_user_refinement``   | awaiting_refinement  |
    | ``active``                                                | active               |
    | phase or socketState ``complete``                         | complete             |
    | failedReason ``aborted by user``                          | aborted              |
    | phase or socketState ``failed``                           | failed               |
    | otherwise                                                 | idle                 |

    Resumable = not active, not complete, and (phase or socketState is
    ``failed``) — the ``listResumable`` rule.
    """
    active = state.get("active") is True
    phase = state.get("phase")
    socket_state = _field(state, "socketState", "socket_state")
    complete = phase == "complete" or socket_state == "complete"
    failed = phase == "failed" or socket_state == "failed"
    resumable = not active and not complete and failed
    if active:
        return ("awaiting_refinement" if socket_state == "awaiting_user_refinement" else "active"), False
    if complete:
        return "complete", False
    if failed and (_field(state, "failedReason", "failed_reason") == "aborted by user" or state.get("aborted") is True):
        return "aborted", resumable
    if failed:
        return "failed", resumable
    return "idle", resumable


def _field(state: dict[str, Any], camel: str, snake: str) -> Any:
    """pi-materia's camelCase key, else castor's engine state key (snake_case)."""
    value = state.get(camel)
    return state.get(snake) if value is None else value


def _iso_field(state: dict[str, Any]) -> str | None:
    value = _field(state, "updatedAt", "updated_at")
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return iso_utc_ms(value)
    return None


def _flock_fd(path: str | os.PathLike[str]) -> int:
    """Take an exclusive ``flock`` on ``path`` (created if missing) across processes; the
    descriptor holding it (closing it releases the lock).

    The same kind of lock as :class:`castor.adapters.materia.cast_lease.CastLease`: it belongs
    to the open file description, so the kernel drops it when the holder dies (even by
    ``kill -9``). Blocks until it is free.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def _flocked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold :func:`_flock_fd`'s lock on ``path`` for the ``with`` block."""
    fd = _flock_fd(path)
    try:
        yield
    finally:
        os.close(fd)


# One lock per state file, shared by every store of this process that writes it. Held weakly:
# a lock lives as long as a store holds it (a CastActor's store, for as long as the actor runs),
# so a long-lived process keeps none per finished cast.
_THREAD_LOCKS: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(path: str | os.PathLike[str]) -> threading.Lock:
    key = os.fspath(path)
    with _THREAD_LOCKS_GUARD:
        lock = _THREAD_LOCKS.get(key)
        if lock is None:
            lock = _THREAD_LOCKS[key] = threading.Lock()
        return lock


_ALLOCATED_ROW_KEY = cast_index.IndexRow(cast_id="", status="active").key  # allocate_cast_id's row

_HEADER = re.compile(rb'\A\{"format":\s*(\d+),\s*"castId":\s*"(?:[^"\\]|\\.)*",\s*"revision":\s*(\d+),'
                     rb'\s*"incarnation":\s*(\d+),')
_HEADER_BYTES = 512


def _document(cast_id: str, revision: int, incarnation: int, saved_at: str, state_json: EncodedState) -> bytes:
    """The stored document, header fields first (the fence check reads only those); one copy of
    the state's JSON (given in pieces, they are joined here, with the header)."""
    # compact_json of {"format", "castId", "revision", "incarnation", "savedAt"} without its closing
    # brace, spelled out: the same escaping of the two strings (the C encoder's), ints as JSON writes them.
    head = (f'{{"format":{int(FORMAT)},"castId":{encode_basestring(cast_id)},"revision":{int(revision)},'
            f'"incarnation":{int(incarnation)},"savedAt":{encode_basestring(saved_at)}')
    if isinstance(state_json, str):
        state_json = state_json.encode("utf-8")
    body = [state_json] if isinstance(state_json, bytes) else state_json
    document = b"".join((head.encode("utf-8"), b',"state":', *body, b"}\n"))
    if len(document) > MAX_STATE_BYTES:  # never write what no reader would read back
        raise StateTooLarge(errno.EFBIG, f"a state document of {len(document)} bytes is over castor's "
                                         f"{MAX_STATE_BYTES}-byte bound")
    return document


def _read_header(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(revision, incarnation)`` of the stored document, or None if there is none.

    Reads the first bytes only when the document starts with castor's header; any other
    layout (an older writer, a hand edit) is parsed in full. A corrupt file raises StateCorrupt.
    """
    try:
        # A raw descriptor, not a file object: this runs on every save (no buffer, no extra fstat).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a planted FIFO reads empty: corrupt
        try:
            head = os.read(fd, _HEADER_BYTES)
            match = _HEADER.match(head)
            if match is None or int(match.group(1)) != FORMAT:
                with open(fd, "rb", closefd=False) as handle:
                    raw = (head + handle.read()).decode("utf-8")
                stored = _parse_document(path, raw)
                return stored.revision, stored.incarnation
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        if is_storage_fault(exc):
            raise  # the storage, not the document: the caller types it (storage_unavailable)
        raise StateCorrupt(f"cannot read {path}: {exc}", data={"path": str(path)}) from None
    return int(match.group(2)), int(match.group(3))


def _parse_document(path: str | os.PathLike[str], raw: str) -> StoredState:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # a deep nesting or a huge integer too, never a traceback
        raise StateCorrupt(f"{path} is not valid JSON", data={"path": str(path), "error": json_problem(exc)}) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("state"), dict):
        raise StateCorrupt(f"{path} is not a state document", data={"path": str(path)})
    try:
        return StoredState(
            cast_id=doc["castId"],
            revision=doc["revision"],
            incarnation=doc["incarnation"],
            saved_at=doc["savedAt"],
            state=doc["state"],
        )
    except (KeyError, ValueError) as exc:
        raise StateCorrupt(f"{path} misses state fields", data={"path": str(path), "error": str(exc)}) from None


class CastStateStore:
    """Load, save and fence cast state documents under one artifact root."""

    def __init__(self, artifact_root: str | os.PathLike[str], *, resolved: bool = False) -> None:
        """``resolved``: ``artifact_root`` is already symlink-resolved (``Runtime.artifact_root_for``)."""
        self._root = ConfinedRoot(artifact_root, resolved=resolved)
        # cast id -> (its thread lock, lock file, state file, run directory as text): see _locked
        # cast id -> (its thread lock, its lock file, its state file, its run directory): plain text
        # paths, no pathlib object on a save's way (it runs on every transition)
        self._locks: dict[str, tuple[threading.Lock, str, str, str]] = {}
        # cast id -> (file signature, revision, incarnation) of the document this store last
        # wrote: a save whose file still has that signature knows its header without reading it.
        self._written: dict[str, tuple[tuple[int, int, int, int], int, int]] = {}
        self._indexed: dict[str, tuple[Any, ...]] = {}  # cast id -> the summary key this store last indexed
        # (cast id, its run directory) as the last claim's walk found it: artifacts() takes it once
        self._claimed: tuple[str, str] | None = None

    @property
    def root(self) -> ConfinedRoot:
        """The confined artifact root this store reads and writes under."""
        return self._root

    @functools.cached_property
    def artifact_root(self) -> Path:
        return self._root.root

    # -- paths ---------------------------------------------------------------

    def state_path(self, cast_id: str) -> Path:
        return Path(self._root.join_text(f"{validate_cast_id(cast_id)}/{STATE_FILE}"))

    def artifacts(self, cast_id: str) -> CastArtifacts:
        """The :class:`CastArtifacts` of ``cast_id`` under this store's (already resolved) root. Asked
        right after this store's claim of the cast (a CastActor's start), its run directory is the
        one the claim's walk found, not walked again."""
        claimed, self._claimed = self._claimed, None
        return CastArtifacts(self._root.text, cast_id, root_resolved=True,
                             run_dir=claimed[1] if claimed is not None and claimed[0] == cast_id else None)

    def _locked(self, cast_id: str) -> tuple[threading.Lock, str, str, str]:
        # Resolved, created and locked once per store and cast: a save is on every transition.
        # The file itself is re-checked every time: a symlink planted there goes through the
        # full containment check again (and is refused if it leads outside the root).
        entry = self._locks.get(cast_id)
        if entry is not None and os.path.islink(entry[3]):
            # The run directory itself replaced by a link while the cast runs (moved away, a link to
            # it, or to a sibling's directory, in its place): castor made it with mkdir, so a link
            # there is never castor's; writing through it would save this cast wherever it leads.
            raise Forbidden(f"the run directory of cast {cast_id} was replaced by a link; refusing to write "
                            "through it", data={"reason": REASON_SYMLINK, "root": self._root.text,
                                                "part": cast_id})
        if entry is not None and os.path.islink(entry[2]):
            self.state_path(cast_id)
            entry = None
        if entry is None:
            # state_path's text (join_text spells paths as pathlib does), with no Path made: a
            # cast's start takes this way on its caller's thread
            path = self._root.join_text(f"{validate_cast_id(cast_id)}/{STATE_FILE}")
            run_dir = split_text(path)[0]
            if not os.path.isdir(run_dir):
                make_private_dir(run_dir)
            # the run directory's text too: a save checks it for a link every time
            entry = self._locks[cast_id] = (_thread_lock(path), f"{run_dir}/{LOCK_FILE}", path, run_dir)
        return entry

    def _fresh_locked(self, cast_id: str) -> bool:
        """:meth:`_locked`'s entry for a new cast, made when its run directory is a directory (not
        a link) and holds no state file: True then. The same two ``lstat`` s the containment walk
        makes (the run directory, then the state file), each also telling what ``_locked``'s
        ``isdir`` and the fresh claim's ``lexists`` asked again; the same texts (the walk's
        spelling). Anything else there (a link, a file, a state already, an error) is False: the
        general path looks and decides, as before."""
        run_dir = f"{self._root.text.rstrip('/')}/{validate_cast_id(cast_id)}"
        try:
            if not stat.S_ISDIR(os.lstat(run_dir).st_mode):
                return False
        except OSError:
            return False
        path = f"{run_dir}/{STATE_FILE}"
        try:
            os.lstat(path)
        except FileNotFoundError:
            self._locks[cast_id] = (_thread_lock(path), f"{run_dir}/{LOCK_FILE}", path, run_dir)
            return True
        except OSError:
            return False
        return False

    # -- reads ---------------------------------------------------------------

    def load(self, cast_id: str) -> StoredState:
        """The stored document; NotFound if none, StateCorrupt if unreadable. Read a component at a
        time from ``/`` along the checked path, no link followed: a run directory (or one above it)
        swapped for a link between the check and the read is refused (``forbidden``), never read
        through -- what ``status``, ``casts`` and the console show of a cast is what its run
        directory holds."""
        return self._load_at(self.state_path(cast_id), cast_id)

    @staticmethod
    def _load_at(path: Path, cast_id: str) -> StoredState:
        try:
            raw = _read_state_text(path)
        except FileNotFoundError:
            run = pi_materia_runs.describe(str(path.parent))
            if run is not None:  # pi-materia kept its state in the harness's session, not here
                raise NotFound(f"cast {cast_id} is {run.reason()}; castor has no state to show or resume it from",
                               data={"cast_id": cast_id, "reason": "pi_materia_run"}) from None
            raise NotFound(f"no persisted state for cast {cast_id}", data={"cast_id": cast_id}) from None
        except NotADirectoryError:
            raise run_directory_replaced(path.parent, cast_id) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Forbidden(f"cast {cast_id}'s state {path} is reached through a symbolic link now "
                                f"({exc.filename}), which castor never follows",
                                data={"reason": REASON_SYMLINK, "cast_id": cast_id,
                                      "path": str(exc.filename)}) from None
            if is_storage_fault(exc):
                raise storage_unavailable(exc, path=path, action="read") from None
            raise StateCorrupt(f"cannot read {path}: {exc}", data={"path": str(path)}) from None
        except UnicodeDecodeError as exc:
            if is_storage_fault(exc):
                raise storage_unavailable(exc, path=path, action="read") from None
            raise StateCorrupt(f"cannot read {path}: {exc}", data={"path": str(path)}) from None
        stored = _parse_document(path, raw)
        foreign = foreign_owner(path)
        return stored if foreign is None else stored.model_copy(update={"foreign": foreign})

    def _load_or_none(self, path: Path, cast_id: str) -> StoredState | None:
        """The stored document at ``path`` (the cast's checked state path), or None if there is none."""
        if not os.path.lexists(path):
            return None
        try:
            return self._load_at(path, cast_id)
        except NotFound:
            return None

    # -- writes --------------------------------------------------------------

    def claim(self, cast_id: str) -> int:
        """Take ownership of a cast: return (and persist) the next incarnation.

        Any holder of an older incarnation is fenced off from then on. Claiming
        a cast with no stored state returns 1 and writes no state document yet,
        only the fence (an empty state with revision 0).
        """
        return self.claim_loaded(cast_id)[0]

    def claim_loaded(self, cast_id: str, *, at_least: int = 1, fresh: bool = False) -> tuple[int, StoredState]:
        """:meth:`claim`, also returning the document as it stands after the claim (one read).

        ``at_least``: the incarnation handed out is never lower (a caller's own restart count,
        so a restarted actor outranks every earlier one of this process even if none of them
        saved). ``fresh``: the caller is creating this cast and nothing is stored yet — the
        claim then writes no fence document (the first save creates it with this incarnation,
        and an earlier incarnation that never saved cannot exist); a stored document is
        claimed as usual. A fresh cast's run directory is one ``allocate_cast_id`` just made:
        its index row says "active", which every reader re-reads from ``state.json`` anyway, so
        the first save (still active) writes no index row.
        """
        self._written.pop(cast_id, None)
        self._claimed = None
        if fresh and cast_id not in self._locks and self._fresh_locked(cast_id):
            # The run directory there (no link) and no state in it (two lstats: see _fresh_locked)
            self._claimed = (cast_id, self._locks[cast_id][3])
            self._indexed[cast_id] = _ALLOCATED_ROW_KEY
            first = max(1, at_least)
            return first, StoredState(cast_id=cast_id, revision=0, incarnation=first, saved_at=iso_now_ms(),
                                      state={})
        tlock, lock_path, path_text, _ = self._locked(cast_id)
        if fresh and not os.path.lexists(path_text):
            # Nothing to fence and nothing to read, so no lock either: the first save takes the
            # locks and reads whatever header is there by then (a writer that got in first is
            # seen there, exactly as it would be after a claim made under the lock).
            self._indexed[cast_id] = _ALLOCATED_ROW_KEY
            first = max(1, at_least)
            return first, StoredState(cast_id=cast_id, revision=0, incarnation=first, saved_at=iso_now_ms(),
                                      state={})
        path = Path(path_text)
        with tlock, _flocked(lock_path):
            current = self._load_or_none(path, cast_id)
            incarnation = max((current.incarnation if current else 0) + 1, at_least)
            if current is None and fresh:  # created meanwhile, then removed: as above
                self._indexed[cast_id] = _ALLOCATED_ROW_KEY
                return incarnation, StoredState(cast_id=cast_id, revision=0, incarnation=incarnation,
                                                saved_at=iso_now_ms(), state={})
            self._remove_orphan_temps(path)
            stored = self._write(path, cast_id, current.revision if current else 0, incarnation,
                                 current.state if current else {})
            return incarnation, stored

    @staticmethod
    def _remove_orphan_temps(path: Path) -> None:
        # Writers hold the lock while a temp file exists, so under the lock any
        # temp file is debris of a writer that died mid-write.
        prefix = f".{path.name}."
        with os.scandir(path.parent) as entries:
            debris = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
        for leftover in debris:
            try:
                os.unlink(leftover)
            except OSError:
                pass

    def save(
        self,
        cast_id: str,
        state: dict[str, Any],
        *,
        incarnation: int,
        expected_revision: int | None = None,
    ) -> StoredState:
        """Persist ``state`` atomically; refuse stale incarnations and revision races."""
        encoded = json.dumps(state, ensure_ascii=False, allow_nan=False)  # before the lock: bad state writes nothing
        revision, incarnation, saved_at = self.save_encoded(cast_id, encoded, incarnation=incarnation,
                                                            expected_revision=expected_revision)
        return StoredState(cast_id=cast_id, revision=revision, incarnation=incarnation, saved_at=saved_at, state=state)

    def save_encoded(
        self,
        cast_id: str,
        state_json: EncodedState,
        *,
        incarnation: int,
        expected_revision: int | None = None,
        index: Any = None,
    ) -> tuple[int, int, str]:
        """:meth:`save` for a state already serialised as a JSON object; returns
        ``(revision, incarnation, saved_at)`` of the written document.

        The fence is checked against the stored document's *header* (it is written first, so
        a bounded read finds it; anything unexpected falls back to a full parse), so the cost
        of a save does not grow with the state.

        ``index``: the state just serialised (a ``CastState``); its listing row is written to the
        cast index, after the save, when its summary differs from what this store last indexed.
        """
        # The cast's locks, taken inline (no generator context managers: this runs on every
        # transition): the thread lock, then the cross-process flock, released in reverse order.
        last = self._written.pop(cast_id, None)  # put back by the save, if it succeeds
        tlock, lock_path, path, run_dir = self._locks[cast_id] if last is not None else self._locked(cast_id)
        with tlock:
            lock_fd = _flock_fd(lock_path)
            try:
                path, current = self._current(cast_id, path, run_dir, last)
                stored_incarnation = current[1] if current else 0
                if current is not None and incarnation < stored_incarnation:
                    raise Conflict(
                        f"cast {cast_id} is owned by incarnation {stored_incarnation}; write from {incarnation} "
                        "refused",
                        data={"reason": "stale_incarnation", "stored": stored_incarnation, "given": incarnation},
                    )
                revision = current[0] if current else 0
                if expected_revision is not None and expected_revision != revision:
                    raise Conflict(
                        f"cast {cast_id} is at revision {revision}, expected {expected_revision}",
                        data={"reason": "revision_mismatch", "stored": revision, "expected": expected_revision},
                    )
                new_incarnation = max(incarnation, stored_incarnation)
                saved_at = iso_now_ms()
                atomic_write_bytes(path, _document(cast_id, revision + 1, new_incarnation, saved_at, state_json),
                                   mode=PRIVATE_FILE_MODE)
                st = os.lstat(path)
                self._written[cast_id] = (stat_signature(st), revision + 1, new_incarnation)
            finally:
                os.close(lock_fd)
        if index is not None:
            self._index(cast_id, index, st)
        return revision + 1, new_incarnation, saved_at

    def _index(self, cast_id: str, state: Any, st: os.stat_result) -> None:
        # The key first (a few attribute reads): most transitions change none of it.
        status, resumable = _status_of_state(state)
        exhaustion = state.recovery_exhaustion
        revivable = bool(resumable and exhaustion is not None and state.failed_reason is not None
                         and exhaustion.failed_reason == state.failed_reason)
        if self._indexed.get(cast_id) == (status, resumable, revivable, state.failed_reason):
            return
        row = _row_from_fields(cast_id, _fields_of(state), signature_text(st), saved_at=None)
        if cast_index.best_effort(self._root.text, lambda index: index.upsert([row], soon=True)):
            self._indexed[cast_id] = row.key

    def _current(self, cast_id: str, path: str, run_dir: str,
                 last: tuple[tuple[int, int, int, int], int, int] | None) -> tuple[str, tuple[int, int] | None]:
        """Under the cast's locks: its state path (in ``run_dir``) and stored ``(revision, incarnation)``.

        Under the locks no castor writer can change the file, and every castor writer replaces it
        by ``rename`` (a new inode, new ctime). So when the file is still the regular file this
        store last wrote (``last``: same inode, size, mtime and ctime, one ``lstat``), its header
        is the one written and needs no read; anything else (another writer, a hand edit, a
        planted link) goes through the checked path and the header read.
        """
        if last is not None:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and stat_signature(st) == last[0] \
                    and not os.path.islink(run_dir):  # the same file, reached through a link: not castor's
                return path, (last[1], last[2])
            path = self._locked(cast_id)[2]  # changed underneath: the checked path
        return path, _read_header(path)

    @staticmethod
    def _write(path: Path, cast_id: str, revision: int, incarnation: int, state: dict[str, Any]) -> StoredState:
        stored = StoredState(
            cast_id=cast_id, revision=revision, incarnation=incarnation, saved_at=iso_now_ms(), state=state
        )
        encoded = json.dumps(state, ensure_ascii=False, allow_nan=False)
        atomic_write_bytes(path, _document(cast_id, revision, incarnation, stored.saved_at, encoded),
                           mode=PRIVATE_FILE_MODE)
        return stored

    # -- listing -------------------------------------------------------------

    def list_casts(self) -> CastListing:
        return list_casts(self.artifact_root)


def _summary(stored: StoredState) -> CastSummary:
    return _to_summary(_row_from_fields(stored.cast_id, stored.state, "", saved_at=stored.saved_at))


def _status_of_state(state: Any) -> tuple[CastStatus, bool]:
    """:func:`cast_status` of a ``CastState`` object, without building its document."""
    socket_state = state.socket_state
    complete = state.phase == "complete" or socket_state == "complete"
    failed = state.phase == "failed" or socket_state == "failed"
    resumable = not state.active and not complete and failed
    if state.active:
        return ("awaiting_refinement" if socket_state == "awaiting_user_refinement" else "active"), False
    if complete:
        return "complete", False
    if failed and (state.failed_reason == "aborted by user" or state.aborted is True):
        return "aborted", resumable
    if failed:
        return "failed", resumable
    return "idle", resumable


def _fields_of(state: Any) -> dict[str, Any]:
    """The fields of a ``CastState`` a listing row is made of, as the state document holds them."""
    exhaustion = state.recovery_exhaustion
    return {"active": state.active, "phase": state.phase, "socket_state": state.socket_state,
            "failed_reason": state.failed_reason, "aborted": state.aborted,
            "current_socket_id": state.current_socket_id, "updated_at": state.updated_at, "request": state.request,
            "recovery_exhaustion": None if exhaustion is None else {"failed_reason": exhaustion.failed_reason}}


#: The fields a listing row is read from, with the type a state castor wrote gives each: a hand-edited
#: state holding anything else is listed unreadable (every verb on it is ``state_corrupt``), not
#: offered as a recast target it cannot be. (name in pi-materia's document, in castor's, type, may be null or missing)
_ROW_FIELDS = (("active", "active", bool, True), ("phase", "phase", str, True),
               ("socketState", "socket_state", str, True), ("aborted", "aborted", bool, True),
               ("currentSocketId", "current_socket_id", str, True), ("failedReason", "failed_reason", str, True))


def _row_from_fields(cast_id: str, state: dict[str, Any], sig: str, *, saved_at: str | None) -> IndexRow:
    wrong = [snake for camel, snake, kind, nullable in _ROW_FIELDS
             if not isinstance(value := _field(state, camel, snake), kind) and not (nullable and value is None)]
    if wrong:
        return _unreadable(cast_id, f"state.json: {', '.join(wrong)} hold{'s' if len(wrong) == 1 else ''} a value "
                                    "castor cannot read", sig)
    status, resumable = cast_status(state)
    current = _field(state, "currentSocketId", "current_socket_id")
    request = state.get("request")
    reason = _field(state, "failedReason", "failed_reason")
    exhaustion = _field(state, "recoveryExhaustion", "recovery_exhaustion")
    revivable = bool(resumable and isinstance(exhaustion, dict) and reason is not None
                     and _field(exhaustion, "failedReason", "failed_reason") == reason)
    return IndexRow(cast_id=cast_id, status=status, resumable=resumable, revivable=revivable,
                    current_socket=current if isinstance(current, str) else None,
                    updated_at=_iso_field(state) or saved_at or iso_now_ms(),
                    request=request if isinstance(request, str) else None,
                    failed_reason=reason if isinstance(reason, str) else None, sig=sig)


def _to_summary(row: IndexRow) -> CastSummary:
    # status: the index stores only valid ones (the str column is narrower than its type says)
    return CastSummary(cast_id=row.cast_id, status=row.status, current_socket=row.current_socket,  # type: ignore[arg-type]  # the index row's status is one of the summary's literals
                       updated_at=row.updated_at or "", resumable=row.resumable, request=row.request,
                       failed_reason=row.failed_reason, revivable=row.revivable)


def _unreadable(cast_id: str, reason: str, sig: str) -> IndexRow:
    return IndexRow(cast_id=cast_id, status="unreadable", failed_reason=reason, sig=sig)


def _without_state(root: str, cast_id: str, sig: str) -> IndexRow:
    """The row of a cast directory with no ``state.json``: pi-materia's own run (its events say how
    it stands: :mod:`~castor.adapters.materia.pi_materia_runs`), else a directory castor cannot
    read. Either way unreadable -- no verb can take it up -- but a pi-materia run says what it was."""
    events_sig = _events_sig(root, cast_id)  # taken first: a line appended meanwhile is read next time
    run = pi_materia_runs.describe(f"{root}/{cast_id}")
    if run is None:
        return _unreadable(cast_id, "no state.json", sig)
    return IndexRow(cast_id=cast_id, status="unreadable", failed_reason=run.reason(), sig=events_sig,
                    current_socket=run.socket, request=run.request)


#: The signature a pi-materia run's row keeps: its ``events.jsonl``'s, so a listing re-reads the run
#: when pi-materia has written to it since (one ``lstat`` when it has not).
_EVENTS_SIG = "events:"


def _events_sig(root: str, cast_id: str) -> str:
    try:
        return _EVENTS_SIG + signature_text(os.lstat(f"{root}/{cast_id}/{CastArtifacts.EVENTS}"))
    except OSError:
        return _EVENTS_SIG + "?"


def _state_sig(root: str, cast_id: str) -> str | None:
    """The stat signature of a cast's ``state.json``: "" if there is none, None if its directory is gone."""
    try:
        return signature_text(os.lstat(f"{root}/{cast_id}/{STATE_FILE}"))
    except FileNotFoundError:
        return "" if os.path.isdir(f"{root}/{cast_id}") else None
    except OSError:
        return "?"


def run_directory_replaced(run_dir: Path, cast_id: str) -> StateCorrupt:
    """The error for a cast whose run directory is no directory now (a file, a FIFO moved or written
    in its place, mid-cast or since): its storage is damaged -- never "unknown cast id", which
    would send the user looking for a typo."""
    try:
        mode = os.lstat(run_dir).st_mode
        what = ("a regular file" if stat.S_ISREG(mode) else "a symbolic link" if stat.S_ISLNK(mode)
                else "something that is not a directory")
    except OSError:
        what = "something that is not a directory"
    return StateCorrupt(f"cast {cast_id}'s storage is damaged: {what} is in place of its run directory {run_dir}; "
                        "restore the directory (its state.json and artifacts), or remove it "
                        f"(`rm {run_dir}`) to drop the cast",
                        data={"cast_id": cast_id, "path": str(run_dir), "reason": "run_directory_replaced"})


def _read_state_text(path: Path) -> str:
    """``state.json``'s text, read as :func:`~castor.adapters.fs.read_regular_file` reads: a FIFO or
    a device planted in its place, or a file over :data:`MAX_STATE_BYTES`, is ``state_corrupt`` at
    once, never waited on or read into memory. Read without following a link anywhere on its path
    (``OSError`` ``ELOOP`` for one): ``path`` is one the store checked (:meth:`CastStateStore.state_path`,
    a resolved root and no link below it), so a link there now was swapped in since."""
    try:
        raw = read_regular_file(path, MAX_STATE_BYTES, links_on_the_way=False)
    except ValueError as exc:
        raise StateCorrupt(f"{path} is {_refused_file(exc)}", data={"path": str(path)}) from None
    return raw.decode("utf-8")


def _refused_file(exc: ValueError) -> str:
    """What :func:`~castor.adapters.fs.read_regular_file` refused, as the end of "PATH is ...":
    a directory, not a regular file, or larger than the bound."""
    return str(exc) or "not a regular file"


def _read_row(store: CastStateStore, cast_id: str, sig: str) -> IndexRow:
    """A cast's row read from its ``state.json`` (the truth)."""
    try:
        stored = store.load(cast_id)
    except NotFound:
        return _without_state(store.root.text, cast_id, sig)
    except CastorError as exc:
        return _unreadable(cast_id, exc.message, sig)
    if stored.revision == 0:
        return _unreadable(cast_id, "claimed, no state saved yet", sig)
    return _row_from_fields(cast_id, stored.state, sig, saved_at=stored.saved_at)


def _listed_row(root: str, cast_id: str) -> IndexRow:
    """:func:`_read_row` for a cast directory just listed from the root as a real directory (not a
    link): ``state.json`` is opened with ``O_NOFOLLOW`` (no containment walk needed below a checked
    directory), its signature taken from the open file, the document parsed without building a
    model: the rebuild's path, ``O(casts)`` once, so every microsecond counts."""
    path = f"{root}/{cast_id}/{STATE_FILE}"
    try:
        # The run directory opened a component at a time, none followed if it is a link: one
        # swapped for a link (or a directory above it) since the root was listed never leads the
        # read elsewhere. O_NONBLOCK: a FIFO planted as state.json must not hang the listing (it is
        # refused below).
        run_fd = open_without_links(f"{root}/{cast_id}", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=run_fd)
        finally:
            os.close(run_fd)
    except FileNotFoundError:
        return _without_state(root, cast_id, "")
    except NotADirectoryError:
        return _unreadable(cast_id, run_directory_replaced(Path(root, cast_id), cast_id).message, "?")
    except OSError as exc:
        if exc.errno == errno.ELOOP and exc.filename == f"{root}/{cast_id}":
            return _unreadable(cast_id, run_directory_replaced(Path(root, cast_id), cast_id).message, "?")
        return _unreadable(cast_id, f"cannot read {path}: {exc}", "?")
    try:
        st = os.fstat(fd)
        sig = signature_text(st)
        if not stat.S_ISREG(st.st_mode):
            return _unreadable(cast_id, f"{path} is not a regular file", sig)
        if st.st_size > MAX_STATE_BYTES:
            return _unreadable(cast_id, f"{path} is larger than {MAX_STATE_BYTES} bytes", sig)
        with open(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:  # grown since the fstat
            return _unreadable(cast_id, f"{path} is larger than {MAX_STATE_BYTES} bytes", sig)
    except OSError as exc:
        return _unreadable(cast_id, f"cannot read {path}: {exc}", "?")
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return _unreadable(cast_id, f"{path} is not valid JSON", sig)
    if not isinstance(doc, dict) or not isinstance(doc.get("state"), dict):
        return _unreadable(cast_id, f"{path} is not a state document", sig)
    revision, saved_at = doc.get("revision"), doc.get("savedAt")
    if not isinstance(revision, int) or not isinstance(saved_at, str) or "castId" not in doc \
            or "incarnation" not in doc:
        return _unreadable(cast_id, f"{path} misses state fields", sig)
    if revision == 0:
        return _unreadable(cast_id, "claimed, no state saved yet", sig)
    return _row_from_fields(cast_id, doc["state"], sig, saved_at=saved_at)


#: The shape of an id castor allocates (its start's UTC time, ``-N`` when two starts share a millisecond).
_ALLOCATED_ID = re.compile(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z(-\d+)?")


def _cast_dir_names(root: str) -> list[str] | None:
    """The names under ``root`` that are cast directories (not hidden, not symlinks, valid ids), and
    the regular files named as castor names a cast (a run directory replaced by a file: listed as
    unreadable, with what happened to it, rather than dropped from the listing without a word)."""
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return None
    names = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if not entry.is_dir(follow_symlinks=False) and not (
                entry.is_file(follow_symlinks=False) and _ALLOCATED_ID.fullmatch(entry.name)):
            continue
        try:
            validate_cast_id(entry.name)
        except CastorError:
            continue
        names.append(entry.name)
    return names


def _abandoned_and_removed(root: str, cast_id: str) -> bool:
    """A listed directory without ``state.json`` that :func:`discard_abandoned_start` removed."""
    return not os.path.lexists(f"{root}/{cast_id}/{STATE_FILE}") and discard_abandoned_start(root, cast_id)


def _reconcile(index: cast_index.CastIndex, store: CastStateStore) -> None:
    """Bring the index in line with the root's directories if someone else changed them."""
    root = store.root.text
    before = root_signature(root)
    if not index.fresh and before is not None and index.root_signature_stored() == before:
        return
    names = _cast_dir_names(root) or []
    known = index.ids()
    names = [n for n in names if n in known or not _abandoned_and_removed(root, n)]
    on_disk = set(names)
    missing = [n for n in names if n not in known]
    if missing:
        logger.info("cast index of {root}: adding {n} cast(s) it did not know", root=root, n=len(missing))
    for start in range(0, len(missing), 1000):
        batch = missing[start:start + 1000]
        index.upsert([_listed_row(root, n) for n in batch])
    gone = known - on_disk
    if gone:
        index.delete(gone)
    index.set_root_signature(before)
    index.fresh = False


def _verify(index: cast_index.CastIndex | None, store: CastStateStore, rows: list[IndexRow]) -> list[IndexRow]:
    """Each row as its ``state.json`` has it now: cheap (one ``lstat``) for a finished cast whose
    file is the one the row was made from; re-read otherwise. Rows of vanished directories drop out."""
    root = store.root.text
    out: list[IndexRow] = []
    fixed: list[IndexRow] = []
    gone: list[str] = []
    for row in rows:
        sig = _state_sig(root, row.cast_id)
        if sig is None or (sig == "" and discard_abandoned_start(root, row.cast_id)):
            gone.append(row.cast_id)
            continue
        if sig == "" and row.sig.startswith(_EVENTS_SIG):  # pi-materia's run: its events are what change
            sig = _events_sig(root, row.cast_id)
        if sig == row.sig and sig != "?" and row.status not in ACTIVE:
            out.append(row)
            continue
        fresh = _read_row(store, row.cast_id, sig)
        if fresh.key != row.key or (fresh.status not in ACTIVE and fresh.sig != row.sig):
            fixed.append(fresh)  # an active row is re-read every time: its changing signature is not kept
        out.append(fresh)
    if index is not None and (fixed or gone):
        try:
            if fixed:
                index.upsert(fixed)
            if gone:
                index.delete(gone)
        except cast_index.IndexUnavailable as exc:
            logger.debug("cast index of {root} not corrected: {exc}", root=root, exc=exc)
    return out


def _parse_cursor(cursor: str | None) -> tuple[int, str] | None:
    if cursor is None:
        return None
    flag, sep, cast_id = str(cursor).partition(":")
    if not sep or flag not in ("0", "1"):
        raise InvalidParams(f"invalid cursor {str(cursor)[:80]!r}", data={"reason": "invalid_cursor"})
    try:
        validate_cast_id(cast_id)
    except CastorError:
        raise InvalidParams(f"invalid cursor {str(cursor)[:80]!r}", data={"reason": "invalid_cursor"}) from None
    return int(flag), cast_id


def _cursor_of(row: IndexRow) -> str:
    return f"{1 if row.unreadable else 0}:{row.cast_id}"


_WHERE = {None: "", "readable": "unreadable = 0", "candidate": "candidate = 1", "revivable": "revivable = 1"}
_UNREADABLE = "unreadable = 1"


def _after(row: IndexRow, after: tuple[int, str] | None) -> bool:
    """Whether ``row`` comes after the cursor position ``after`` in listing order."""
    if after is None:
        return True
    flag = 1 if row.unreadable else 0
    return flag > after[0] or (flag == after[0] and row.cast_id < after[1])


def _indexed_rows(artifact_root: str | os.PathLike[str], *, where: str | None = None, batch: int = DEFAULT_PAGE,
                  after: tuple[int, str] | None = None) -> Generator[tuple[IndexRow, str], None, None]:
    """Every row (verified) after the cursor position ``after``, newest id first, readable before
    unreadable, with its cursor; from the index, or from a scan of every ``state.json`` when the
    index cannot be used."""
    store = CastStateStore(artifact_root)
    root = store.root.text
    if not os.path.isdir(root):
        return
    index = cast_index.open_index(root)
    if index is not None:
        try:
            _reconcile(index, store)
            # A directory listed unreadable that was repaired since goes back to its place among the
            # casts before the listing starts (there are few, and each costs one lstat when unchanged).
            _verify(index, store, index.page(None, MAX_PAGE, where=_UNREADABLE))
            # A row that turns out unreadable on the way moves to the unreadable ones (the index is
            # corrected by _verify): it is listed there, once, not also where it was found.
            listed: set[str] = set()
            moved: dict[str, IndexRow] = {}
            while True:
                rows = index.page(after, batch, where=_WHERE[where])
                if not rows:
                    break
                fetched_to = (1 if rows[-1].unreadable else 0, rows[-1].cast_id)
                was_unreadable = {row.cast_id: row.unreadable for row in rows}
                for row in _verify(index, store, rows):
                    if row.cast_id in listed:
                        continue
                    if row.unreadable and not was_unreadable[row.cast_id]:
                        moved[row.cast_id] = row
                        continue
                    if _matches(row, where):
                        listed.add(row.cast_id)
                        yield row, _cursor_of(row)
                after = fetched_to  # and where a fallback below resumes
                batch = min(batch * 2, MAX_PAGE)
            for cast_id in sorted(moved, reverse=True):  # any the index could not be told about
                row = moved[cast_id]
                if cast_id not in listed and _matches(row, where):
                    listed.add(cast_id)
                    yield row, _cursor_of(row)
            return
        except cast_index.IndexUnavailable as exc:
            logger.warning("cast index of {root} unusable ({exc}); listing from every state.json", root=root, exc=exc)
            cast_index.forget(root)
            if isinstance(exc, cast_index.IndexCorrupt):
                cast_index.remove_database(root)
    rows = [_listed_row(root, n) for n in _cast_dir_names(root) or [] if not _abandoned_and_removed(root, n)]
    rows.sort(key=lambda r: r.cast_id, reverse=True)
    rows.sort(key=lambda r: r.unreadable)
    for row in rows:
        if _after(row, after) and _matches(row, where):
            yield row, _cursor_of(row)


def _matches(row: IndexRow, where: str | None) -> bool:
    if where == "readable":
        return not row.unreadable
    if where == "candidate":
        return row.resumable or row.status in ACTIVE
    if where == "revivable":
        return row.revivable
    return True


def list_page(artifact_root: str | os.PathLike[str], *, limit: int | None = DEFAULT_PAGE,
              cursor: str | None = None) -> CastPage:
    """One page of the casts under ``artifact_root``: casts newest id first, then unreadable
    directories; ``limit`` None lists everything. ``cursor``: a previous page's ``next_cursor``.
    Costs ``O(limit)`` with a current index (see ``cast_index.py``)."""
    if limit is not None and (limit < 1 or limit > MAX_PAGE):
        raise InvalidParams(f"limit must be 1..{MAX_PAGE}", data={"reason": "invalid_limit"})
    after = _parse_cursor(cursor)
    casts: list[CastSummary] = []
    problems: list[UnreadableCast] = []
    next_cursor = None
    taken = 0
    store = CastStateStore(artifact_root)
    root = store.root.text
    rows = _indexed_rows(artifact_root, batch=min(limit or MAX_PAGE, MAX_PAGE) + 1, after=after)
    last_cursor = None
    for row, row_cursor in rows:
        if limit is not None and taken == limit:
            next_cursor = last_cursor
            break
        taken += 1
        last_cursor = row_cursor
        if row.unreadable:
            problems.append(UnreadableCast(cast_id=row.cast_id, path=f"{root}/{row.cast_id}/{STATE_FILE}",
                                           reason=row.failed_reason or "unreadable",
                                           current_socket=row.current_socket, request=row.request))
        else:
            casts.append(_to_summary(row))
    rows.close()
    return CastPage(casts=casts, problems=problems, next_cursor=next_cursor, total=_total(root))


def _total(root: str) -> int:
    index = cast_index.open_index(root, create=False) if os.path.isdir(root) else None
    if index is None:
        names = _cast_dir_names(root) if os.path.isdir(root) else None
        return len(names or [])
    try:
        return index.count()
    except cast_index.IndexUnavailable:
        return 0


def newest(artifact_root: str | os.PathLike[str], where: str) -> Iterator[CastSummary]:
    """Casts newest id first that may match ``where`` (``readable``, ``candidate``: resumable or
    active, ``revivable``), each verified against its ``state.json``; stop iterating when found."""
    for row, _cursor in _indexed_rows(artifact_root, where=where):
        yield _to_summary(row)


def discard_unsaved(artifact_root: str | os.PathLike[str], cast_id: str) -> bool:
    """Remove the run directory of a cast whose first state was never saved (a failed start), and
    its index row; True if it was removed. A directory holding a ``state.json`` is kept."""
    root = os.fspath(artifact_root)
    run_dir = f"{root}/{validate_cast_id(cast_id)}"
    if os.path.lexists(f"{run_dir}/{STATE_FILE}") or not os.path.isdir(run_dir):
        return False
    before = root_signature(root)
    shutil.rmtree(run_dir, ignore_errors=True)
    after = root_signature(root)
    cast_index.best_effort(root, lambda index: index.moved(before, after, delete=cast_id), create=False)
    return not os.path.lexists(run_dir)


#: What a start makes in its run directory before the cast's first save is in place: the lease, the
#: store's lock, the CLI's note, the two empty artifact directories, and the temporary file of a
#: first save (or note) cut off before its rename. Anything else (an events.jsonl, an artifact) is
#: the user's and makes a directory without ``state.json`` damaged, never abandoned.
_START_FILES = frozenset({"owner.lock", LOCK_FILE, "cli.json"})
_START_DIRS = frozenset({"sockets", "contexts"})

#: How long a run directory with nothing but a start's files must have been left alone before a
#: reader takes it for a start that died before its first save (a ``kill -9`` between the id's
#: ``mkdir`` and the first save). A live start holds the cast's lease from a moment after the
#: ``mkdir`` and saves within milliseconds; the wait covers that moment, by a wide margin.
ABANDONED_START_AFTER_S = 60.0


def _bare_start(run_dir: str, min_age_s: float) -> bool:
    """No ``state.json``, only a start's files (its two directories empty, no links), the directory
    unchanged for ``min_age_s``."""
    try:
        st = os.lstat(run_dir)
        if not stat.S_ISDIR(st.st_mode) or time.time() - st.st_mtime < min_age_s:
            return False
        with os.scandir(run_dir) as entries:
            for entry in entries:
                if (entry.name in _START_FILES or temp_target(entry.name) in (STATE_FILE, "cli.json")) \
                        and entry.is_file(follow_symlinks=False):
                    continue
                if entry.name in _START_DIRS and entry.is_dir(follow_symlinks=False) \
                        and not os.listdir(entry.path):
                    continue
                return False  # state.json, an events log, an artifact, a link: not a bare start
    except OSError:
        return False
    return True


def is_abandoned_start(artifact_root: str | os.PathLike[str], cast_id: str, *,
                       min_age_s: float = ABANDONED_START_AFTER_S) -> bool:
    """Whether ``<root>/<cast_id>`` is a start that died before its cast's first save: no
    ``state.json``, only a start's files (see ``_START_FILES``), unchanged for ``min_age_s``, and
    its lease free. Such a directory was never a cast (its client got an error, no cast id): it
    holds nothing to keep."""
    from castor.adapters.materia.cast_lease import CastLease

    run_dir = f"{os.fspath(artifact_root)}/{validate_cast_id(cast_id)}"
    return _bare_start(run_dir, min_age_s) and not CastLease.is_held(artifact_root, cast_id)


def discard_abandoned_start(artifact_root: str | os.PathLike[str], cast_id: str) -> bool:
    """Remove ``cast_id``'s run directory if it is an abandoned start (:func:`is_abandoned_start`),
    holding its lease while it looks again and removes it (a runtime taking the cast up meanwhile
    keeps it); True if removed. Never raises for a directory it cannot remove."""
    from castor.adapters.materia.cast_lease import CastLease

    run_dir = f"{os.fspath(artifact_root)}/{validate_cast_id(cast_id)}"
    if not _bare_start(run_dir, ABANDONED_START_AFTER_S):
        return False
    try:
        lease = CastLease.try_acquire(artifact_root, cast_id)
    except (OSError, CastorError):
        return False
    if lease is None:
        return False  # a live start or runtime holds it
    try:
        removed = _bare_start(run_dir, 0.0) and discard_unsaved(artifact_root, cast_id)
    finally:
        lease.release()
    if removed:
        logger.info("removed {dir}: a cast start that died before its first save", dir=run_dir)
    return removed


def list_casts(artifact_root: str | os.PathLike[str]) -> CastListing:
    """Summaries of every cast under ``artifact_root``, newest update first.

    Directories that are not valid cast ids are ignored; cast directories whose
    state is missing, unreadable or corrupt are reported in ``problems``.
    A missing root lists nothing.
    """
    page = list_page(artifact_root, limit=None)
    casts = sorted(page.casts, key=lambda c: c.updated_at, reverse=True)
    return CastListing(casts=casts, problems=page.problems)

