"""The artifact directory of one cast: ``<artifactRoot>/<castId>/``.

Layout (names kept from pi-materia so its tools keep working)::

    config.resolved.json   full merged config, 2-space JSON
    manifest.json          {castId, request, configSource, sessionFile?, entries:[...]}, one entry per line
    usage.json             the UsageReport, rewritten often
    events.jsonl           one {"ts":<ms>,"type":...,"data":{...}} per line
    state.json             the persisted cast state (see state_store.py)
    sockets/<seg(socket)>/<visit>[-<seg(item)>].md                  socket output
    sockets/<seg(socket)>/<visit>.json                              parsed JSON
    sockets/<seg(socket)>/<visit>[-<seg(item)>].refinement-<turn>-<seg(entry)>.md
    sockets/<seg(socket)>/<visit>[-<seg(item)>].input.json          utility input
    sockets/<seg(socket)>/<visit>[-<seg(item)>].command.{stdout.txt,stderr.txt,json}
    contexts/<seg(socket)>[-<seg(item)>]-<visit>[-<seg(suffix)>].md

Guarantees
----------
- Every path is built through :class:`castor.adapters.fs.ConfinedRoot` (the
  answers of :func:`castor.adapters.fs.safe_join`); cast ids
  and socket ids are validated first (``[A-Za-z0-9][A-Za-z0-9._-]*``, at most
  128 characters), so ``../x``, ``/etc``, ``a/b``, NUL or over-long ids raise
  :class:`Forbidden` and touch nothing. Item keys, entry ids and suffixes are
  free text and go through ``seg`` (spec: runs outside ``[A-Za-z0-9._-]``
  become ``-``; empty becomes ``task``), capped in length.
- Every file name fits the filesystem: a path component longer than
  ``MAX_NAME_BYTES`` (combined free-text parts can exceed ``NAME_MAX``) is
  shortened deterministically by :func:`fit_name` -- head, a hash of the whole
  name, tail (the extension survives) -- so the same logical path always maps
  to the same file and two long names never collide. Without it a long
  model-chosen work item id made every write fail with ``ENAMETOOLONG``.
- Whole-file artifacts are written atomically; events are appended as whole
  lines with fsync (``append_events``: a batch in one write and one fsync).
  ``add_manifest_entries`` appends a batch with one atomic rewrite, from the
  manifest this object keeps in memory (re-read when the file's identity —
  inode, mtime, size — is not the one it wrote), so manifest.json is a
  complete, valid document after every rewrite and after ``kill -9``.
- Paths go through one :class:`castor.adapters.fs.ConfinedRoot` per object:
  the run dir is resolved once, every component below it is checked on every
  call (a symlink planted later is still refused if it leads outside). All writes of one cast directory are serialised
  by one process-wide lock per directory, so concurrent appends from several threads
  (and several ``CastArtifacts`` objects for the same cast) never interleave
  and manifest read-modify-writes never lose an entry.

Failure behaviour
-----------------
- Invalid ids or escaping relative paths: ``Forbidden`` (code ``forbidden``).
- Reading a missing JSON artifact: ``NotFound``; an unparseable one:
  ``ArtifactCorrupt`` (code ``state_corrupt``, ``data.path``), not-UTF-8 text included.
- OS errors (disk full, permissions) propagate as ``OSError``.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from json.encoder import encode_basestring  # json's C string encoder (what compact_json uses)
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from castor.adapters.fs import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    ConfinedRoot,
    JsonLinesRead,
    SkippedLine,
    TooLarge,
    append_json_line,
    append_json_texts,
    atomic_write_bytes,
    compact_json,
    dump_json,
    file_signature,
    fsync_dir,
    make_dir,
    make_durable_dirs,
    make_private_dir,
    one_line_json,
    read_json_lines,
    read_last_json_line,
    read_regular_file,
    split_text,
)
from castor.adapters.materia import cast_index
from castor.domain.jsontext import json_problem
from castor.domain.timestamps import iso_now_ms, iso_utc_ms
from castor.messages.errors import CastorError, Conflict, Forbidden, NotFound
from castor.messages.ids import check_safe_id
from castor.ports.cast_storage import StateCorrupt

__all__ = [
    "ArtifactCorrupt",
    "CastArtifacts",
    "CommandArtifacts",
    "EventLog",
    "EventRecord",
    "allocate_cast_id",
    "fit_name",
    "seg",
    "validate_cast_id",
    "validate_socket_id",
]

MAX_SEG_LENGTH = 120
#: Longest file name castor writes, in bytes: NAME_MAX (255) minus room for the
#: atomic writer's temp name ``.<name>.<pid>.<hex>.tmp``.
MAX_NAME_BYTES = 200
_NAME_TAIL = 32
_SEG_RUN = re.compile(r"[^A-Za-z0-9._-]+")


#: The largest JSON file of a run directory castor reads (``events.jsonl``, ``manifest.json``,
#: ``usage.json``, ``config.resolved.json``): a real cast's are kilobytes to megabytes. A larger one --
#: a sparse file of many gigabytes a checkout ships costs its disk nothing -- is refused unread.
MAX_RUN_FILE_BYTES = 256 * 1024 * 1024


class ArtifactCorrupt(StateCorrupt):
    """A JSON artifact exists but cannot be parsed: the data's fault (damaged, truncated, not
    UTF-8), never castor's -- ``state_corrupt``, as a damaged ``state.json`` is."""


# --------------------------------------------------------------------------- ids and segments


def validate_cast_id(cast_id: object) -> str:
    """Return ``cast_id`` if it satisfies the safe-id rule (``castor.messages.ids``), else raise Forbidden."""
    return check_safe_id(cast_id, "cast_id")


def validate_socket_id(socket_id: object) -> str:
    """Return ``socket_id`` if it satisfies the safe-id rule (``castor.messages.ids``), else raise Forbidden."""
    return check_safe_id(socket_id, "socket_id")


def seg(value: object) -> str:
    """pi-materia's ``seg``: a safe file-name segment for free text (never empty, capped).

    A segment over ``MAX_SEG_LENGTH`` keeps its head and ends in a hash of the
    whole text, so two long keys sharing a prefix never name the same file.
    """
    text = _SEG_RUN.sub("-", str(value)).strip("-")
    if len(text) > MAX_SEG_LENGTH:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        text = f"{text[:MAX_SEG_LENGTH - len(digest) - 1].strip('-')}-{digest}"
    if text in ("", ".", ".."):
        return "task"
    return text


def fit_name(name: str) -> str:
    """``name`` if it fits in ``MAX_NAME_BYTES``, else ``<head>~<sha256[:16]>~<tail>`` within it."""
    raw = name.encode("utf-8")
    if len(raw) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    tail = raw[-_NAME_TAIL:].decode("utf-8", "ignore")
    room = MAX_NAME_BYTES - len(tail.encode("utf-8")) - len(digest) - 2
    head = raw[:room].decode("utf-8", "ignore")
    return f"{head}~{digest}~{tail}"


def _check_visit(visit: object) -> int:
    if isinstance(visit, bool) or not isinstance(visit, int) or visit < 0:
        raise Forbidden(f"visit must be a non-negative integer, got {visit!r}", data={"reason": "invalid visit"})
    return visit


def _timestamp_id(now: datetime | None) -> str:
    iso = iso_now_ms() if now is None else iso_utc_ms(now.timestamp())
    return iso.replace(":", "-").replace(".", "-")


def allocate_cast_id(artifact_root: str | os.PathLike[str], *, now: datetime | None = None,
                     root_resolved: bool = False) -> str:
    """Allocate a fresh cast id and create its run directory, its index row written (see
    :func:`allocate_unindexed`)."""
    cast_id, index_row = allocate_unindexed(artifact_root, now=now, root_resolved=root_resolved)
    index_row()
    return cast_id


def allocate_unindexed(artifact_root: str | os.PathLike[str], *, now: datetime | None = None,
                       root_resolved: bool = False) -> tuple[str, Callable[[], None]]:
    """Allocate a fresh cast id and create its run directory; with it, what writes its index row.

    The id is the UTC ISO timestamp with ``:`` and ``.`` replaced by ``-``
    (``2026-05-12T19-40-40-605Z``); a collision adds ``-1``, ``-2``, ...
    Uniqueness holds across threads *and* processes because the directory is
    claimed with an exclusive ``mkdir``. A directory whose creation cannot be made durable (the
    root's fsync fails) is removed again and the ``OSError`` raised: a failed allocation leaves
    nothing behind.

    The second value writes the new directory's index row (``active``: unverified until its first
    save) and moves the root's stored signature from before the ``mkdir`` to after it by
    compare-and-set; called later (a start does it on the cast's thread, once the starter has its
    answer), it inserts the row only if none is there by then (a reader's reconcile, or the cast's
    own later save, wrote a truer one), and until then a reader finds the root's signature changed
    and reconciles, as after any directory made by someone else. Never called: the same.
    """
    root = os.fspath(artifact_root)
    confined = ConfinedRoot(root, resolved=root_resolved)
    base = _timestamp_id(now)
    # The root made (private) if missing and the index's file made, both before the root's "before"
    # signature is taken (their creation moves it). A root whose index this process has open was
    # there already: its first mkdir tells whether it still is (ENOENT, ENOTDIR: made or refused
    # then, and the mkdir tried again), with no stat before, and the index's file is not checked
    # here: the row is written through open_index (below), which sees a file deleted meanwhile.
    root_checked = cast_index.opened(confined.text) is None
    if root_checked:
        _artifact_root_made(root)
        cast_index.open_index(confined.text)
    # The new directory's path is the root's text and one name castor makes (a timestamp, checked
    # here): no containment walk before the mkdir, which never follows a link in its place (a link
    # or anything else there is EEXIST: the next name is tried).
    prefix = confined.text.rstrip("/")
    n = 0
    while n < 10_000:
        candidate = base if n == 0 else f"{base}-{n}"
        made = f"{prefix}/{confined.check(candidate)}"
        before = cast_index.root_signature(confined.text)
        try:
            make_dir(made, PRIVATE_DIR_MODE)  # its files are the user's alone
        except FileExistsError:
            n += 1
            continue
        except (FileNotFoundError, NotADirectoryError):
            if root_checked:
                raise
            root_checked = True
            _artifact_root_made(root)
            cast_index.open_index(confined.text)
            continue  # the same name again, in the root made now
        try:
            fsync_dir(root)
        except OSError:
            # Made but not durable (a failing device, a full thin volume): the start fails, so its
            # directory is taken back rather than left empty, to list as unreadable.
            try:
                os.rmdir(made)
            except OSError:
                pass
            raise
        after = cast_index.root_signature(confined.text)
        # Its row (active: unverified until its first save) and the root's signature moved along,
        # so the next listing needs no rescan of the root (see cast_index.py).
        row = cast_index.IndexRow(cast_id=candidate, status="active")

        def record(index: cast_index.CastIndex, before: Any = before, after: Any = after,
                   row: cast_index.IndexRow = row) -> None:
            index.moved(before, after, insert=row, keep_existing=True, soon=True)

        def index_row(text: str = confined.text) -> None:
            cast_index.best_effort(text, record)  # a start writes it on the cast's thread (index_later)

        return candidate, index_row
    raise CastorError(f"could not allocate a cast id under {root}", data={"base": base})


def _artifact_root_made(root: str) -> None:
    """The artifact root made (private: its index holds each request's head) if it is missing;
    ``Conflict`` if something else is in its place."""
    try:
        if not os.path.isdir(root):
            make_private_dir(root)
    except (FileExistsError, NotADirectoryError):
        raise Conflict(f"the artifact directory {root} is not a directory",
                       data={"reason": "artifact_root_not_a_directory", "path": str(root)}) from None


# A start's index rows not written yet (``allocate_cast_id(..., index_later=True)``): run directory
# text -> (when it was left, what writes the row). Taken once, by whoever comes first: the cast's
# thread after the starter's answer (index_allocated), or a failed start's clean-up (forget_allocated).
# A cast that never runs its first message (its actor died before it, its incarnations gave up) takes
# neither: so the table is bounded, the oldest rows dropped unwritten once more than
# _UNINDEXED_KEPT wait or one has waited _UNINDEXED_MAX_S. Dropping one is safe: the index is a cache
# and its stored root signature stays the one before the mkdir, so the next listing reconciles and
# finds the directory (as one made by someone else); the cast's own later saves write its row too.
_UNINDEXED: dict[str, tuple[float, Callable[[], None]]] = {}
_UNINDEXED_GUARD = threading.Lock()
_UNINDEXED_KEPT = 256
_UNINDEXED_MAX_S = 300.0


def allocate_cast_id_indexed_later(artifact_root: str | os.PathLike[str], *, root_resolved: bool = False) -> str:
    """:func:`allocate_cast_id` with the index row left for :func:`index_allocated` (see
    :func:`allocate_unindexed`)."""
    cast_id, index_row = allocate_unindexed(artifact_root, root_resolved=root_resolved)
    now = time.monotonic()
    with _UNINDEXED_GUARD:
        pending = _UNINDEXED
        while pending:
            oldest = next(iter(pending))  # insertion order: the oldest first
            if len(pending) < _UNINDEXED_KEPT and now - pending[oldest][0] < _UNINDEXED_MAX_S:
                break
            del pending[oldest]  # never taken: dropped unwritten (a listing reconciles it)
        pending[f"{os.fspath(artifact_root)}/{cast_id}"] = (now, index_row)
    return cast_id


def index_allocated(artifact_root: str | os.PathLike[str], cast_id: str) -> None:
    """Write the index row of a cast allocated with its row left for later, if not done yet."""
    with _UNINDEXED_GUARD:
        left = _UNINDEXED.pop(f"{os.fspath(artifact_root)}/{cast_id}", None)
    if left is not None:
        left[1]()


def forget_allocated(artifact_root: str | os.PathLike[str], cast_id: str) -> None:
    """Drop the index row left for later of a cast whose start failed (its directory is removed)."""
    with _UNINDEXED_GUARD:
        _UNINDEXED.pop(f"{os.fspath(artifact_root)}/{cast_id}", None)


# --------------------------------------------------------------------------- records


class EventRecord(BaseModel):
    """One line of ``events.jsonl``."""

    model_config = ConfigDict(frozen=True)

    ts: int
    type: str
    data: dict[str, Any]


class EventLog(BaseModel):
    """The readable events of a cast plus the lines that were skipped (torn/corrupt)."""

    model_config = ConfigDict(frozen=True)

    events: list[EventRecord]
    skipped: list[SkippedLine]


class CommandArtifacts(BaseModel):
    """Where a utility command's outputs were written (absolute and run-dir-relative)."""

    model_config = ConfigDict(frozen=True)

    stdout: Path
    stderr: Path
    meta: Path
    stdout_rel: str
    stderr_rel: str
    meta_rel: str


# --------------------------------------------------------------------------- per-directory locks

# Held weakly: a directory's lock lives as long as a CastArtifacts object of it does, so a
# long-lived process keeps none per finished cast (every writer of a directory shares one lock
# while any of them exists; with none left, nothing is writing).
_LOCKS: weakref.WeakValueDictionary[str, threading.RLock] = weakref.WeakValueDictionary()
_LOCKS_GUARD = threading.Lock()


_FITTED_CACHE_SIZE = 4096  # distinct relative paths remembered per cast directory
_SHORT_PATH = MAX_NAME_BYTES // 4  # characters: a path this short has no component to fit


def _lock_for(run_dir: str | Path) -> threading.RLock:
    key = str(run_dir)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = threading.RLock()
        return lock


def _manifest_line(entry: Any) -> str:
    return one_line_json(entry)


# The manifest text is its top-level fields, then ``entries`` with one entry per line: the same
# document, laid out so the C JSON encoder writes it (an entry per line stays
# readable and diffable) instead of a pretty-printer per rewrite.
def _manifest_fields(meta: dict[str, Any]) -> str:
    """The manifest's opening and top-level fields (all but ``entries``): fixed per cast."""
    fields = [f"  {one_line_json(k)}: {one_line_json(v)}" for k, v in meta.items() if k != "entries"]
    return "{\n" + "".join(f"{f},\n" for f in fields)


# The manifest's ``entries``, after its fields: ``  "entries": [\n    `` + the entry lines joined by
# ``,\n    `` + ``\n  ]\n}\n``, or ``  "entries": []\n}\n`` for none; in bytes, as the writes join
# them (a manifest's entries are kept joined, so an append encodes and joins its new lines only)
_ENTRY_SEP = ",\n    "
_ENTRY_SEP_BYTES = _ENTRY_SEP.encode()
_ENTRIES_OPEN = b'  "entries": [\n    '
_ENTRIES_CLOSE = b"\n  ]\n}\n"
_NO_ENTRIES = b'  "entries": []\n}\n'


def _now_ms() -> int:
    return int(time.time() * 1000)


def _event_lines(events: list[tuple[str, dict[str, Any], int]],
                 data_json: Sequence[str | None] | None = None) -> list[str]:
    """``events.jsonl`` lines of ``(type, data, ts_ms)`` tuples: each exactly
    ``compact_json({"ts": int(ts_ms), "type": type, "data": data or {}})``, its fixed fields written
    here and only ``data`` through the encoder (no record dict made, two members fewer encoded: a
    cast transition appends three lines). ``data_json``: per event, its data's ``compact_json``
    made already (the cast's outbox entry made it: the data is encoded once), or None. ValueError
    for an empty type."""
    lines = []
    for i, (type_, data, ts_ms) in enumerate(events):
        if not isinstance(type_, str) or not type_:
            raise ValueError("event type must be a non-empty string")
        text = data_json[i] if data_json is not None else None
        if text is None:
            text = compact_json(data or {})
        # an int's JSON is its str(); a str's is json's own string encoder's (what compact_json uses)
        lines.append(f'{{"ts":{int(ts_ms)},"type":{encode_basestring(type_)},"data":{text}}}')
    return lines


# --------------------------------------------------------------------------- the run directory


class CastArtifacts:
    """All file IO for one cast's run directory. Thread-safe."""

    CONFIG = "config.resolved.json"
    MANIFEST = "manifest.json"
    USAGE = "usage.json"
    EVENTS = "events.jsonl"

    def __init__(self, artifact_root: str | os.PathLike[str], cast_id: str, *, root_resolved: bool = False,
                 run_dir: str | None = None) -> None:
        """``root_resolved``: ``artifact_root`` is already symlink-resolved (a store passes its own).
        ``run_dir``: the run directory as the root's containment walk gave it a moment before (a
        store's claim of the cast, on the same thread): not walked again."""
        self.cast_id = validate_cast_id(cast_id)
        root = ConfinedRoot(artifact_root, resolved=root_resolved)
        # The run dir, resolved once: join_text answers with a symlink-free or resolved path.
        # Plain strings here (a cast's start makes one of these); the Path views are made on demand.
        self._run_prefix = run_dir if run_dir is not None else root.join_text(self.cast_id)
        self._artifact_root_text = root.text
        self._lock = _lock_for(self._run_prefix)
        self._root = ConfinedRoot(self._run_prefix, resolved=True)
        self._made: set[str] = set()  # directories known to exist: no mkdir per write
        self._fitted: dict[str, str] = {}  # relative path -> checked, fitted relative path
        # The manifest as last written by this object, and the file identity it was written
        # as: an append rewrites it from memory unless the file changed underneath.
        self._manifest_meta: dict[str, Any] | None = None
        self._manifest_count = 0  # the entries of the manifest this object wrote last
        self._manifest_sig: tuple[int, int, int, int] | None = None
        self._manifest_head: str = ""  # _manifest_fields(self._manifest_meta), rendered once per meta
        self._manifest_head_bytes = b""  # the same, UTF-8
        # b",\n    ".join of that manifest's entry lines, UTF-8: an append encodes and joins its new lines
        # only (the text alone is kept, not the lines too: a live cast's memory). None: forgotten
        # while the cast waits (forget_kept), taken back from the file this object wrote
        self._manifest_body: bytes | None = b""

    @functools.cached_property
    def run_dir(self) -> Path:
        return Path(self._run_prefix)

    def forget_kept(self) -> None:
        """Drop what this object keeps between writes -- the manifest's entries' text, the
        directories and paths it has checked -- while its cast waits for a turn (a live cast's
        memory, ~10 KiB at ten sockets, growing with its entries). The next append takes the text
        back from the file, sliced out of the bytes this object wrote (one read, no parse) while
        the file is the one it wrote (its signature), else reads it as after another writer's
        change; paths are checked again: the same bytes either way."""
        with self._lock:
            self._made, self._fitted = set(), {}
            self._manifest_body = None

    @functools.cached_property
    def artifact_root(self) -> Path:
        return Path(self._artifact_root_text)

    # -- basics -------------------------------------------------------------

    def create(self) -> CastArtifacts:
        """Create the run directory with ``sockets/`` and ``contexts/`` (idempotent).

        Each directory created here is made durable in its parent; one that already existed
        (a run dir ``allocate_cast_id`` made, a resumed cast's) costs no fsync.
        """
        with self._lock:
            run_dir = self._run_prefix
            if not os.path.isdir(run_dir):
                make_durable_dirs(run_dir)
            made = False
            for sub in ("sockets", "contexts"):
                target = self._target(sub)
                try:
                    make_dir(target, PRIVATE_DIR_MODE)
                    made = True
                except FileExistsError:
                    if not os.path.isdir(target):  # a file, a FIFO or a link in its place: the run
                        # directory is damaged (a typed refusal, never a crash that restarting repeats)
                        raise NotADirectoryError(errno.ENOTDIR, "not a directory", target) from None
            if made:
                fsync_dir(run_dir)
        return self

    def exists(self) -> bool:
        return self.run_dir.is_dir()

    def path(self, relative: str) -> Path:
        """The absolute path of ``relative`` inside the run dir; Forbidden if it escapes.

        Over-long components are shortened by :func:`fit_name` (after the
        escape checks see the original text, so ``..`` is never hidden).
        """
        return Path(self._target(relative))

    def _target(self, relative: str) -> str:
        """:meth:`path` as a string: the write hot path (several calls per cast transition).

        The text checks and name fitting of a relative path never change, so they are done once
        per path; the containment walk (``lstat`` of each existing component) runs every call.
        """
        return self._root.join_text(self._fitted_path(relative))

    def _fitted_path(self, relative: str) -> str:
        fitted = self._fitted.get(relative)
        if fitted is None:
            text = str(relative)
            self._root.check(text)  # the escape checks see the original text: ".." is never hidden
            # A text of at most MAX_NAME_BYTES // 4 characters has no component over MAX_NAME_BYTES
            # bytes (UTF-8 takes at most 4 per character): nothing to fit.
            fitted = text if len(text) <= _SHORT_PATH else "/".join(fit_name(part) for part in text.split("/"))
            if len(self._fitted) < _FITTED_CACHE_SIZE:
                self._fitted[relative] = fitted
        return fitted

    def _transition_targets(self, relatives: Iterable[str]) -> list[str]:
        """The targets of one transition's writes, each *directory* walked once.

        Same containment as :meth:`_target` for everything that can redirect a write: every
        directory component is ``lstat``-ed (a planted directory symlink leading out is refused);
        the final component is not, because a transition never writes *through* it — a whole
        file is replaced by ``rename`` (which replaces a planted link itself) and an event log is
        opened with ``O_NOFOLLOW`` (refused).
        """
        checked: dict[str, str] = {}
        out = []
        for relative in relatives:
            head, _, name = self._fitted_path(relative).rpartition("/")
            if not head:
                out.append(f"{self._run_prefix}/{name}")
                continue
            directory = checked.get(head)
            if directory is None:
                # head is a prefix of a fitted path _fitted_path has checked: its text checks pass
                # (fitting adds no "..", NUL, empty or absolute part), so only the walk runs again.
                directory = checked[head] = self._root.join_checked_text(head)
            out.append(f"{directory}/{name}")
        return out

    def relative(self, path: Path) -> str:
        """``path`` relative to the run dir, with ``/`` separators."""
        return Path(path).relative_to(self.run_dir).as_posix()

    def _read_json(self, relative: str) -> Any:
        target = self.path(relative)
        try:  # a FIFO planted in its place is refused at once, never waited on (it held the cast's thread)
            raw = read_regular_file(target, MAX_RUN_FILE_BYTES).decode("utf-8")
        except FileNotFoundError:
            raise NotFound(f"{relative} not found for cast {self.cast_id}", data={"path": str(target)}) from None
        except UnicodeDecodeError:
            raise ArtifactCorrupt(f"{relative} of cast {self.cast_id} is not UTF-8 text",
                                  data={"path": str(target)}) from None
        except ValueError as exc:  # a directory, a FIFO, a device, a file over the bound
            raise ArtifactCorrupt(f"{relative} of cast {self.cast_id} is {exc}"
                                  if str(exc) == "a directory" or isinstance(exc, TooLarge)
                                  else f"{relative} of cast {self.cast_id} is not a regular file",
                                  data={"path": str(target)}) from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:  # a deep nesting or a huge integer too
            raise ArtifactCorrupt(
                f"{relative} of cast {self.cast_id} is not valid JSON",
                data={"path": str(target), "error": json_problem(exc)}
            ) from None

    def _write(self, target: str | Path, content: str | bytes | dict[str, Any] | list[Any]) -> Path:
        with self._lock:
            return Path(self._replace(os.fspath(target), content, sync_dir=True))

    def _replace(self, target: str, content: str | bytes | dict[str, Any] | list[Any], *, sync_dir: bool) -> str:
        """Atomically replace ``target`` (under the lock); with ``sync_dir=False`` the caller fsyncs its directory."""
        parent = split_text(target)[0]
        if parent not in self._made:
            make_durable_dirs(parent, PRIVATE_DIR_MODE)
            self._made.add(parent)
        if isinstance(content, str):
            data = content.encode("utf-8")
        elif isinstance(content, bytes):
            data = content
        else:
            data = (dump_json(content) + "\n").encode("utf-8")
        atomic_write_bytes(target, data, sync_dir=sync_dir, mode=PRIVATE_FILE_MODE)
        return target

    def write_relative(self, relative: str, content: str | bytes | dict[str, Any] | list[Any]) -> Path:
        """Write any artifact at a run-dir-relative path (text, bytes, or JSON for dict/list)."""
        return self._write(self._target(relative), content)

    def write_transition(self, files: dict[str, str | bytes], entries: list[dict[str, Any]],
                         events: list[tuple[str, dict[str, Any], int]], *,
                         data_json: Sequence[str | None] | None = None) -> None:
        """One cast transition's file effects: whole files, then manifest entries, then events.

        Same result as :meth:`write_relative` per file, :meth:`add_manifest_entries` and
        :meth:`append_events`, with each directory fsynced once instead of once per file: the
        whole files are replaced, their directories fsynced (so they are durable before the
        manifest or an event names them), then the manifest is rewritten and the events
        appended. ``files`` maps run-dir-relative paths to their content; a whole
        ``manifest.json`` among them (a cast's start) is written in castor's manifest layout and
        kept in memory, so the entries that follow it are appended without reading it back.
        ``data_json``: per event, its data's compact JSON if made already (see :func:`_event_lines`).
        """
        with self._lock:
            synced: set[str] = set()
            for relative, target, content in zip(files, self._transition_targets(files), files.values(), strict=True):
                if relative == self.MANIFEST:  # castor's own layout, and the next append needs no re-read
                    meta, lines = self._manifest_document(content, target)
                    self._write_manifest(meta, _ENTRY_SEP.join(lines).encode("utf-8"), len(lines), target,
                                         sync_dir=False)
                    synced.add(self._run_prefix)
                    continue
                synced.add(split_text(self._replace(target, content, sync_dir=False))[0])
            for directory in synced:
                fsync_dir(directory)
            if entries:
                self._add_manifest_entries_at(f"{self._run_prefix}/{self.MANIFEST}", entries)
            if events:
                append_json_texts(f"{self._run_prefix}/{self.EVENTS}", _event_lines(events, data_json))

    # -- whole-file documents ------------------------------------------------

    def write_config_resolved(self, config: dict[str, Any]) -> Path:
        return self._write(self.path(self.CONFIG), config)

    def read_config_resolved(self) -> dict[str, Any]:
        data: dict[str, Any] = self._read_json(self.CONFIG)
        return data

    def write_usage(self, usage: dict[str, Any]) -> Path:
        return self._write(self._target(self.USAGE), usage)

    def read_usage(self) -> dict[str, Any]:
        data: dict[str, Any] = self._read_json(self.USAGE)
        return data

    def init_manifest(self, *, request: str, config_source: str, session_file: str | None = None) -> Path:
        """Write a manifest with no entries. Overwrites an existing one."""
        manifest: dict[str, Any] = {"castId": self.cast_id, "request": request, "configSource": config_source}
        if session_file is not None:
            manifest["sessionFile"] = session_file
        with self._lock:
            return Path(self._write_manifest(manifest, b"", 0))

    def add_manifest_entry(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append one entry (a ``timestamp`` is added if absent) and rewrite the manifest atomically."""
        return self.add_manifest_entries([entry])[0]

    def add_manifest_entries(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Append ``entries`` in order with ONE atomic rewrite of ``manifest.json``.

        The manifest is kept in memory between appends (no re-parse per entry); it is re-read
        from disk when the file is not the one this object last wrote (another writer, a
        restart). Raises NotFound if there is no manifest yet, ArtifactCorrupt if it is broken.
        """
        with self._lock:
            return self._add_manifest_entries_at(self._target(self.MANIFEST), entries)

    def _add_manifest_entries_at(self, target: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        meta, lines = self._manifest_now(target)
        now_ms = int(time.time() * 1000)  # Date.now(), as pi-materia writes an entry's timestamp
        stored = [entry if "timestamp" in entry else {**entry, "timestamp": now_ms} for entry in entries]
        if stored:
            added = [_manifest_line(r) for r in stored]
            if lines is None:  # the manifest written last: its entries' joined text is kept
                joined = _ENTRY_SEP.join(added).encode("utf-8")
                count, kept = self._manifest_count, self._manifest_body
                assert kept is not None  # _manifest_now took it back
                body = kept + _ENTRY_SEP_BYTES + joined if count else joined
            else:
                count, body = len(lines), _ENTRY_SEP.join(lines + added).encode("utf-8")
            self._write_manifest(meta, body, count + len(added), target)
        return stored

    def _manifest_now(self, target: str) -> tuple[dict[str, Any], list[str] | None]:
        """The manifest's fields and its entry lines, read from ``target``; lines None: the manifest
        is the one this object wrote last (its entries' text is ``_manifest_body``)."""
        if self._manifest_meta is not None and file_signature(target) == self._manifest_sig:
            if self._manifest_body is not None or self._body_from_file(target):
                return self._manifest_meta, None
        return self._split_manifest(self.read_manifest(), target)

    def _body_from_file(self, target: str) -> bool:
        """Take the forgotten entries' text back from ``target``, the manifest this object wrote
        (its bytes are the kept head, the entries' opening, their text and the closing); False if
        the file is not that layout after all (then it is read and split as any other)."""
        try:
            data = read_regular_file(target, MAX_RUN_FILE_BYTES)
        except (OSError, ValueError):
            return False
        head = self._manifest_head_bytes
        if not self._manifest_count:
            if data != head + _NO_ENTRIES:
                return False
            self._manifest_body = b""
            return True
        start = len(head) + len(_ENTRIES_OPEN)
        if not (data.startswith(head) and data.startswith(_ENTRIES_OPEN, len(head)) and data.endswith(_ENTRIES_CLOSE)
                and len(data) >= start + len(_ENTRIES_CLOSE)):
            return False
        self._manifest_body = data[start:len(data) - len(_ENTRIES_CLOSE)]
        return True

    def _split_manifest(self, manifest: Any, target: str) -> tuple[dict[str, Any], list[str]]:
        """A manifest document as its top-level fields and its entry lines; ArtifactCorrupt if it is
        not an object."""
        if not isinstance(manifest, dict):
            raise ArtifactCorrupt(f"{self.MANIFEST} of cast {self.cast_id} is not an object",
                                  data={"path": str(target)})
        entries = manifest.pop("entries", None)
        return manifest, [_manifest_line(e) for e in entries or []]

    def _write_manifest(self, meta: dict[str, Any], body: bytes, count: int, target: str | None = None, *,
                        sync_dir: bool = True) -> str:
        """Write the manifest of ``meta`` and ``count`` entries, ``body`` their lines joined (UTF-8);
        the bytes are :func:`_manifest_fields` + :func:`_manifest_entries`'."""
        with self._lock:
            if meta is self._manifest_meta:
                head, head_bytes = self._manifest_head, self._manifest_head_bytes
            else:
                head = _manifest_fields(meta)
                head_bytes = head.encode("utf-8")
            data = b"".join((head_bytes, _ENTRIES_OPEN, body, _ENTRIES_CLOSE)) if count \
                else head_bytes + _NO_ENTRIES
            target = self._replace(target or self._target(self.MANIFEST), data, sync_dir=sync_dir)
            self._manifest_meta, self._manifest_count, self._manifest_sig = meta, count, file_signature(target)
            self._manifest_head, self._manifest_head_bytes, self._manifest_body = head, head_bytes, body
        return target

    def _manifest_document(self, content: str | bytes, target: str) -> tuple[dict[str, Any], list[str]]:
        """A whole manifest handed to :meth:`write_transition`, split as :meth:`_split_manifest` does."""
        try:
            manifest = json.loads(content)
        except (ValueError, RecursionError) as exc:
            raise ArtifactCorrupt(f"a {self.MANIFEST} for cast {self.cast_id} that is not JSON",
                                  data={"path": target, "error": json_problem(exc)}) from None
        return self._split_manifest(manifest, target)

    def read_manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = self._read_json(self.MANIFEST)
        return data

    # -- events --------------------------------------------------------------

    def append_event(self, type: str, data: dict[str, Any] | None = None, *, ts_ms: int | None = None) -> EventRecord:
        """Append ``{"ts","type","data"}`` as one durable line of ``events.jsonl``."""
        if not isinstance(type, str) or not type:
            raise ValueError("event type must be a non-empty string")
        record = EventRecord(ts=_now_ms() if ts_ms is None else ts_ms, type=type, data=dict(data or {}))
        with self._lock:
            append_json_line(self.path(self.EVENTS), record.model_dump())
        return record

    def append_events(self, events: list[tuple[str, dict[str, Any], int]]) -> None:
        """Append ``(type, data, ts_ms)`` records as lines of ``events.jsonl``: one write, one fsync.

        Everything is serialised first, so a bad record appends nothing; after a crash at most
        the last line is torn (readers skip it, the next append seals it).
        """
        lines = _event_lines(events)
        with self._lock:
            append_json_texts(self._target(self.EVENTS), lines)

    def last_event_line(self) -> Any:
        """The last complete line of ``events.jsonl``, parsed (:func:`~castor.adapters.fs.read_last_json_line`:
        one bounded read, whatever the log's length); None when there is none."""
        return read_last_json_line(self.path(self.EVENTS))

    def event_lines(self) -> JsonLinesRead:
        """``events.jsonl`` as :func:`~castor.adapters.fs.read_json_lines` reads it; a log over
        :data:`MAX_RUN_FILE_BYTES` is :class:`ArtifactCorrupt`, unread."""
        target = self.path(self.EVENTS)
        try:
            return read_json_lines(target, MAX_RUN_FILE_BYTES)
        except TooLarge as exc:
            raise ArtifactCorrupt(f"{self.EVENTS} of cast {self.cast_id} is {exc}",
                                  data={"path": str(target)}) from None

    def read_events(self) -> EventLog:
        """Every complete event line; torn or corrupt lines are reported in ``skipped``."""
        read = self.event_lines()
        events: list[EventRecord] = []
        skipped = list(read.skipped)
        for index, rec in enumerate(read.records):
            try:
                events.append(EventRecord.model_validate(rec))
            except ValueError:
                skipped.append(SkippedLine(line_no=-(index + 1), reason="not an event record"))
        return EventLog(events=events, skipped=skipped)

    # -- socket artifacts ----------------------------------------------------

    @staticmethod
    def _stem(visit: int, item_key: str | None) -> str:
        return f"{visit}" if item_key is None else f"{visit}-{seg(item_key)}"

    def _socket_dir_rel(self, socket_id: str) -> str:
        return f"sockets/{seg(validate_socket_id(socket_id))}"

    def socket_output_path(self, socket_id: str, visit: int, *, item_key: str | None = None) -> Path:
        return self.path(f"{self._socket_dir_rel(socket_id)}/{self._stem(_check_visit(visit), item_key)}.md")

    def write_socket_output(self, socket_id: str, visit: int, text: str, *, item_key: str | None = None) -> Path:
        return self._write(self.socket_output_path(socket_id, visit, item_key=item_key), text)

    def write_socket_json(self, socket_id: str, visit: int, value: Any) -> Path:
        """The parsed JSON of a visit; no item suffix (as in pi-materia)."""
        target = self.path(f"{self._socket_dir_rel(socket_id)}/{_check_visit(visit)}.json")
        return self._write(target, value if isinstance(value, (dict, list)) else json.dumps(value))

    def write_refinement(
        self, socket_id: str, visit: int, turn: int, entry_id: str, text: str, *, item_key: str | None = None
    ) -> Path:
        stem = self._stem(_check_visit(visit), item_key)
        name = f"{stem}.refinement-{_check_visit(turn)}-{seg(entry_id)}.md"
        return self._write(self.path(f"{self._socket_dir_rel(socket_id)}/{name}"), text)

    def write_utility_input(
        self, socket_id: str, visit: int, value: dict[str, Any], *, item_key: str | None = None
    ) -> Path:
        stem = self._stem(_check_visit(visit), item_key)
        return self._write(self.path(f"{self._socket_dir_rel(socket_id)}/{stem}.input.json"), value)

    def write_command_result(
        self,
        socket_id: str,
        visit: int,
        *,
        stdout: str,
        stderr: str,
        stdout_truncated: bool,
        stderr_truncated: bool,
        max_bytes: int,
        item_key: str | None = None,
    ) -> CommandArtifacts:
        """Write ``.command.stdout.txt``, ``.command.stderr.txt`` and ``.command.json``."""
        base = f"{self._socket_dir_rel(socket_id)}/{self._stem(_check_visit(visit), item_key)}.command"
        out, err, meta = (self.path(f"{base}.{suffix}") for suffix in ("stdout.txt", "stderr.txt", "json"))
        with self._lock:
            self._write(out, stdout)
            self._write(err, stderr)
            self._write(
                meta,
                {
                    "stdoutArtifact": str(out),
                    "stderrArtifact": str(err),
                    "stdoutTruncated": stdout_truncated,
                    "stderrTruncated": stderr_truncated,
                    "maxBytes": max_bytes,
                },
            )
        return CommandArtifacts(
            stdout=out,
            stderr=err,
            meta=meta,
            stdout_rel=self.relative(out),
            stderr_rel=self.relative(err),
            meta_rel=self.relative(meta),
        )

    # -- contexts ------------------------------------------------------------

    def context_path(
        self, socket_id: str, visit: int, *, item_key: str | None = None, suffix: str | None = None
    ) -> Path:
        name = seg(validate_socket_id(socket_id))
        if item_key is not None:
            name += f"-{seg(item_key)}"
        name += f"-{_check_visit(visit)}"
        if suffix is not None:
            name += f"-{seg(suffix)}"
        return self.path(f"contexts/{name}.md")

    def write_context(
        self, socket_id: str, visit: int, text: str, *, item_key: str | None = None, suffix: str | None = None
    ) -> Path:
        return self._write(self.context_path(socket_id, visit, item_key=item_key, suffix=suffix), text)
