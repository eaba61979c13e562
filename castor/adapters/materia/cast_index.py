"""The cast index: what ``cast.list`` and the id-less verbs read instead of every ``state.json``.

``<artifactRoot>/.castor-index.sqlite3`` (SQLite; its rollback journal ``...-journal`` is kept
between transactions, so the root's entries do not change per write) holds one row per cast directory: its
listing summary (status, resumable, revivable, current socket, request, failed reason,
updated_at), whether it is unreadable (and why), and the stat signature of the ``state.json``
the row was made from. ``state.json`` stays the truth; the index is a cache that is never
trusted further than it can be checked cheaply:

| who | when | what |
|---|---|---|
| ``allocate_cast_id`` | a new run directory (a start: on the cast's thread once the starter has its answer) | inserts its row (``active``: unverified) unless one is there by then, and moves the stored root signature along (see below) |
| ``CastStateStore.save_encoded`` (with ``index=``) | a save whose summary differs from what this store last indexed (an end, a recast, a pause: a few per cast, not one per transition; a new cast's first save, still active as ``allocate_cast_id``'s row says, writes none) | upserts the row, with the new file's signature |
| ``discard_unsaved`` | a failed start's run directory removed | deletes its row, moves the root signature along |
| a reader (``state_store.discard_abandoned_start``) | a row or a new directory with no ``state.json`` that is a start killed before its first save (only a start's files, untouched for a minute, its lease free) | removes the directory under its lease (``discard_unsaved``): the row goes with it |
| a reader | every row it returns | ``lstat``s the row's ``state.json``: a row that is active, unreadable, or whose signature differs is re-read from ``state.json`` and rewritten; a row whose directory is gone is deleted |
| a reader | the root directory's signature (inode, mtime, link count, size) differs from the stored one | *reconciles*: lists the root's names, adds the directories it does not know (reading their state), deletes rows of directories that are gone, then stores the signature taken before the scan |
| a reader | the database is missing, or unreadable as SQLite | deletes it and rebuilds it from every ``state.json`` (a one-off ``O(casts)``) |

So a page of ``limit`` rows costs ``O(limit)`` (plus ``O(casts)`` once after someone else changed
the root), whatever the number of finished casts. The stored root signature is moved only by
compare-and-set (``stat`` before the ``mkdir``/``rmtree``, ``stat`` after, update only if the
stored value is still the "before"), so a directory made by anyone else in between leaves the
index stale, and the next reader reconciles. Within a process one thread writes an index at a time, each
transaction with every write queued by then: a cast's own rows (its start's, its end's) are
left in that queue when another thread is writing, so casts ending together do not each hold a
thread on the database's lock; every read writes what is queued first. Two runtimes on one project share the database
(SQLite's own locking; a busy index is skipped, never waited on for long); a ``kill -9`` mid-update
leaves the database as of its last commit (the rollback journal; commits are not fsynced — the
index is a cache, so a power cut may cost its last commits, which the checks above catch, or
corrupt it, which the rebuild repairs); a corrupt database is rebuilt. Both files are hidden
files, not directories: nothing that walks the root for cast directories sees them. Every index
failure (disk full, read-only project, a locked or corrupt database) is logged and skipped: it
never fails a save, and a reader that cannot use the index scans every ``state.json`` as castor
did before the index (slow, never wrong).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from castor._log import logger

DB_NAME = ".castor-index.sqlite3"
SCHEMA = 3
MAX_OPEN = 8  # connections kept per process (one per artifact root in use, least recently used out)
BUSY_TIMEOUT_MS = 2000
CACHE_KIB = 64  # SQLite's page cache per open index (its default is 2 MiB); a page reads a few of them
REQUEST_CHARS = 4096  # the listing shows a request's head; the full text stays in state.json
ACTIVE = ("active", "awaiting_refinement")


@dataclass(frozen=True)
class IndexRow:
    cast_id: str
    status: str  # a CastStatus, or "unreadable"
    resumable: bool = False
    revivable: bool = False
    current_socket: str | None = None
    updated_at: str | None = None
    request: str | None = None
    failed_reason: str | None = None  # for an unreadable row: why
    sig: str = ""  # state.json's stat signature when the row was made ("" none)

    def __post_init__(self) -> None:
        # A hand-written state.json may hold a lone surrogate (a JSON escape), which no UTF-8 text
        # holds: neither the index could store the row nor a listing print it, so one such cast
        # failed the whole project's listing. Its texts are kept with the surrogate as its escape.
        for name in ("current_socket", "updated_at", "request", "failed_reason"):
            value = getattr(self, name)
            if isinstance(value, str) and not value.isascii():
                object.__setattr__(self, name, storable(value))

    @property
    def unreadable(self) -> bool:
        return self.status == "unreadable"

    @property
    def key(self) -> tuple[Any, ...]:
        """What a save must change for the row to be rewritten (not the socket, not the time)."""
        return (self.status, self.resumable, self.revivable, self.failed_reason)


def storable(text: str) -> str:
    """``text`` as UTF-8 can hold it: each lone surrogate (which a JSON escape can make, and a file
    name that is no UTF-8 decodes to) as its ``\\uXXXX`` escape; any other text as it is."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


_COLUMNS = "id, status, resumable, revivable, current_socket, updated_at, request, failed_reason, sig"


def _row(values: tuple[Any, ...]) -> IndexRow:
    cid, status, resumable, revivable, socket, updated, request, reason, sig = values
    return IndexRow(cast_id=cid, status=status, resumable=bool(resumable), revivable=bool(revivable),
                    current_socket=socket, updated_at=updated, request=request, failed_reason=reason, sig=sig or "")


def _values(row: IndexRow) -> tuple[Any, ...]:
    request = row.request[:REQUEST_CHARS] if isinstance(row.request, str) else None
    candidate = 1 if (row.resumable or row.status in ACTIVE) else 0
    return (row.cast_id, 1 if row.unreadable else 0, row.status, int(row.resumable), int(row.revivable), candidate,
            row.current_socket, row.updated_at, request, row.failed_reason, row.sig)


_INSERT = ("INSERT OR IGNORE INTO casts (id, unreadable, status, resumable, revivable, candidate, current_socket,"
           " updated_at, request, failed_reason, sig) VALUES (?,?,?,?,?,?,?,?,?,?,?)")
_UPDATE = ("UPDATE casts SET unreadable = ?, status = ?, resumable = ?, revivable = ?, candidate = ?,"
           " current_socket = ?, updated_at = ?, request = ?, failed_reason = ?, sig = ? WHERE id = ?")
_COUNT = "UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key = 'count'"


def _upsert(conn: sqlite3.Connection, values: list[tuple[Any, ...]]) -> None:
    """Insert or update rows, keeping the stored row count (new rows only) current."""
    inserted = conn.executemany(_INSERT, values).rowcount
    if inserted < len(values):  # some existed: update those (re-writing a row just inserted is harmless)
        conn.executemany(_UPDATE, [v[1:] + v[:1] for v in values])
    if inserted:
        conn.execute(_COUNT, (inserted,))


def signature_text(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def root_signature(root: str) -> str | None:
    """What changes whenever a directory is added to or removed from ``root``."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_nlink}:{st.st_size}"


_SCHEMA_OBJECTS = {("table", "casts"), ("table", "meta"), ("index", "casts_order"), ("index", "casts_candidate"),
                   ("index", "casts_revivable"), ("index", "sqlite_autoindex_meta_1")}


class IndexUnavailable(Exception):
    """The index cannot be used here (read-only, full, locked, corrupt beyond a rebuild)."""


class CastIndex:
    """The index of one artifact root. Thread-safe (one connection, one lock)."""

    def __init__(self, root: str, *, create: bool) -> None:
        self.root = root
        self.path = f"{root}/{DB_NAME}"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        # Writes queued for the one thread writing the index now (see _write): a cast's thread
        # leaves its row there and goes on, instead of waiting for the database's lock.
        self._writer = threading.Condition(threading.Lock())
        self._queued: list[Callable[[sqlite3.Connection], object]] = []
        self._writing = False
        self.fresh = False  # the database was (re)created by this object: a full rebuild is due
        self._open(create=create)

    # -- the connection -------------------------------------------------------
    def _open(self, *, create: bool) -> None:
        # The files live in the project, so a checkout could ship them: a link in their place (SQLite
        # would write through it, outside the project) is removed; anything but a regular file
        # (a FIFO would block the open) makes the index unusable here; a schema that is not
        # exactly castor's (triggers, views) is rebuilt (IndexCorrupt).
        for suffix in ("", "-journal", "-wal", "-shm"):
            target = self.path + suffix
            try:
                st = os.lstat(target)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise IndexUnavailable(f"cannot check {target}: {exc}") from None
            if stat.S_ISLNK(st.st_mode):
                logger.warning("cast index: removing the link {path} (castor's index is never a link)", path=target)
                try:
                    os.unlink(target)
                except OSError as exc:
                    raise IndexUnavailable(f"cannot remove the link {target}: {exc}") from None
            elif not stat.S_ISREG(st.st_mode):
                raise IndexUnavailable(f"{target} is not a regular file")
        existed = os.path.exists(self.path)
        if not existed and (not create or not os.path.isdir(self.root)):
            raise IndexUnavailable("no index")
        if not existed:
            # made 0600 before SQLite makes it (0644: anyone who may read the project read each cast's
            # request); its journal takes the database's mode
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise IndexUnavailable(f"cannot create {self.path}: {exc}") from None
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"cannot open {self.path}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA trusted_schema=OFF")
            conn.execute("PRAGMA journal_mode=PERSIST")  # no journal file made and removed per commit
            conn.execute("PRAGMA synchronous=OFF")  # a cache (see the module doc): no fsync per commit
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")  # a page touches few pages: keep memory small
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DROP TABLE IF EXISTS casts")
                conn.execute("DROP TABLE IF EXISTS meta")
                conn.execute("CREATE TABLE casts (id TEXT PRIMARY KEY, unreadable INTEGER NOT NULL, status TEXT NOT"
                             " NULL, resumable INTEGER NOT NULL, revivable INTEGER NOT NULL, candidate INTEGER NOT"
                             " NULL, current_socket TEXT, updated_at TEXT, request TEXT, failed_reason TEXT, sig"
                             " TEXT) WITHOUT ROWID")
                conn.execute("CREATE INDEX casts_order ON casts (unreadable, id DESC)")
                conn.execute("CREATE INDEX casts_candidate ON casts (candidate, id DESC)")
                conn.execute("CREATE INDEX casts_revivable ON casts (revivable, id DESC)")
                conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
                # The row count, kept with every insert and delete: a page's total costs no count of the table.
                conn.execute("INSERT INTO meta (key, value) VALUES ('count', 0)")
                conn.execute(f"PRAGMA user_version={SCHEMA}")
                conn.execute("COMMIT")
                self.fresh = True
            elif not existed:
                self.fresh = True
            else:
                objects = set(conn.execute("SELECT type, name FROM sqlite_master"))
                if objects - _SCHEMA_OBJECTS:
                    raise sqlite3.DatabaseError(f"unexpected schema objects {sorted(objects - _SCHEMA_OBJECTS)[:5]}")
        except sqlite3.Error as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                raise IndexCorrupt(str(exc)) from None
            raise IndexUnavailable(f"cannot use {self.path}: {exc}") from None
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn is None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def _db(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise IndexUnavailable("closed")
            try:
                if write:
                    conn.execute("BEGIN IMMEDIATE")
                yield conn
                if write:
                    conn.execute("COMMIT")
            except BaseException as exc:
                if write and conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                    raise IndexCorrupt(str(exc)) from None
                if isinstance(exc, sqlite3.Error):
                    raise IndexUnavailable(str(exc)) from None
                raise

    # -- writes ---------------------------------------------------------------
    def _write(self, op: Callable[[sqlite3.Connection], object] | None, *, soon: bool = False) -> None:
        """Run ``op`` in a write transaction, with every write queued before it, in queue order.

        One thread writes at a time, each transaction holding every write queued by then. With
        ``soon``, a thread that finds another one writing leaves ``op`` in the queue for it and
        returns at once (nothing waits on the database's lock: casts ending together no longer
        each hold a thread there); its failure is then the writer's, and the row is left as the
        index had it (a cache: readers check every row they return, see the module doc). Without
        ``soon`` (``op`` None: only what is queued -- every read does this first, so a read sees
        every write queued before it), it waits for the writer at work, then writes what is
        queued and ``op`` in one transaction, and raises if it fails."""
        with self._writer:
            if soon:
                assert op is not None
                self._queued.append(op)
                if self._writing:
                    return
            else:
                while self._writing:
                    self._writer.wait()
                if op is None and not self._queued:
                    return
            self._writing = True
            batch, self._queued = self._queued, []
        own = None if soon else op
        try:
            while True:
                with self._db(write=True) as conn:
                    for queued in batch:
                        queued(conn)
                    if own is not None:
                        own(conn)
                        own = None
                with self._writer:
                    batch, self._queued = self._queued, []
                    if not batch:
                        self._writing = False
                        self._writer.notify_all()
                        return
        except BaseException:
            with self._writer:
                self._writing = False
                self._writer.notify_all()
            raise

    def upsert(self, rows: Iterable[IndexRow], *, soon: bool = False) -> None:
        """Insert or update ``rows``; ``soon``: possibly written by the thread writing now (see _write)."""
        values = [_values(r) for r in rows]
        self._write(lambda conn: _upsert(conn, values), soon=soon)

    def delete(self, cast_ids: Iterable[str]) -> None:
        ids = [(c,) for c in cast_ids]

        def delete(conn: sqlite3.Connection) -> None:
            deleted = conn.executemany("DELETE FROM casts WHERE id = ?", ids).rowcount
            if deleted:
                conn.execute(_COUNT, (-deleted,))

        self._write(delete)

    def moved(self, before: str | None, after: str | None, *, insert: IndexRow | None = None,
              delete: str | None = None, keep_existing: bool = False, soon: bool = False) -> None:
        """Record a change castor made to the root (a run directory made or removed) and move the
        stored root signature from ``before`` to ``after`` if it still is ``before``.
        ``keep_existing``: ``insert`` only if the id has no row yet (one there was written later
        than ``insert`` was made: a reader's reconcile, the cast's own save). ``soon``: see _write."""
        def moved(conn: sqlite3.Connection) -> None:
            if insert is not None and keep_existing:
                if conn.execute(_INSERT, _values(insert)).rowcount:
                    conn.execute(_COUNT, (1,))
            elif insert is not None:
                _upsert(conn, [_values(insert)])
            if delete is not None and conn.execute("DELETE FROM casts WHERE id = ?", (delete,)).rowcount:
                conn.execute(_COUNT, (-1,))
            if before is not None and after is not None:
                conn.execute("UPDATE meta SET value = ? WHERE key = 'root' AND value = ?", (after, before))

        self._write(moved, soon=soon)

    def set_root_signature(self, sig: str | None) -> None:
        self._write(lambda conn: conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('root', ?)", (sig,)))

    # -- reads ----------------------------------------------------------------
    def root_signature_stored(self) -> str | None:
        self._write(None)
        with self._db() as conn:
            found = conn.execute("SELECT value FROM meta WHERE key = 'root'").fetchone()
        return found[0] if found else None

    def ids(self) -> set[str]:
        self._write(None)
        with self._db() as conn:
            return {r[0] for r in conn.execute("SELECT id FROM casts")}

    def count(self) -> int:
        """The number of rows (kept by triggers: no scan of the table)."""
        self._write(None)
        with self._db() as conn:
            found = conn.execute("SELECT value FROM meta WHERE key = 'count'").fetchone()
        return int(found[0]) if found else 0

    def page(self, after: tuple[int, str] | None, limit: int, *, where: str = "") -> list[IndexRow]:
        """Rows newest id first, readable ones before unreadable ones, strictly after ``after``."""
        self._write(None)
        sql = f"SELECT {_COLUMNS} FROM casts"
        args: list[Any] = []
        clauses = [where] if where else []
        if after is not None:
            clauses.append("(unreadable > ? OR (unreadable = ? AND id < ?))")
            args += [after[0], after[0], after[1]]
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY unreadable, id DESC LIMIT ?"
        args.append(limit)
        with self._db() as conn:
            return [_row(v) for v in conn.execute(sql, args)]


class IndexCorrupt(IndexUnavailable):
    """The database file is not a usable SQLite database: delete and rebuild it."""


# --------------------------------------------------------------------------- the process's indexes

_OPEN: OrderedDict[str, CastIndex] = OrderedDict()
_OPEN_GUARD = threading.Lock()


def opened(root: str) -> CastIndex | None:
    """The index :func:`open_index` keeps open for ``root`` in this process, if any, without its
    file's check (one ``stat``): what tells a caller that the database file exists already (it
    was made when first opened). Writers look it up with :func:`open_index`, which sees a file
    deleted meanwhile."""
    with _OPEN_GUARD:
        return _OPEN.get(root)


def open_index(root: str, *, create: bool = True) -> CastIndex | None:
    """The index of ``root`` (resolved), opened once per process (LRU of :data:`MAX_OPEN`); None
    if it cannot be used here. A corrupt database is deleted and made again (``fresh``)."""
    with _OPEN_GUARD:
        index = _OPEN.get(root)
        if index is not None and os.path.exists(index.path):
            _OPEN.move_to_end(root)
            return index
        if index is not None:  # deleted underneath: open it again (a rebuild)
            _OPEN.pop(root).close()
        for attempt in (1, 2):
            try:
                index = CastIndex(root, create=create)
                break
            except IndexCorrupt as exc:
                if attempt == 2:
                    logger.warning("cast index {path} unusable: {exc}", path=f"{root}/{DB_NAME}", exc=exc)
                    return None
                logger.warning("cast index {path} is corrupt ({exc}); rebuilding it", path=f"{root}/{DB_NAME}",
                               exc=exc)
                remove_database(root)
            except IndexUnavailable as exc:
                if create:
                    logger.debug("cast index of {root} unavailable: {exc}", root=root, exc=exc)
                return None
        assert index is not None  # the loop above either opened it or returned
        _OPEN[root] = index
        while len(_OPEN) > MAX_OPEN:
            _OPEN.popitem(last=False)[1].close()
        return index


def forget(root: str) -> None:
    """Close and forget ``root``'s index (after it was found corrupt mid-use)."""
    with _OPEN_GUARD:
        index = _OPEN.pop(root, None)
    if index is not None:
        index.close()


def remove_database(root: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(f"{root}/{DB_NAME}{suffix}")
        except OSError:
            pass


def best_effort(root: str, action: Callable[[CastIndex], Any], *, create: bool = True,
                index: CastIndex | None = None) -> bool:
    """Run ``action`` on ``root``'s index; False (logged) if the index is unavailable. A corrupt
    database is deleted, so the next reader rebuilds it. ``index``: ``root``'s index as
    :func:`open_index` gave it moments before (a start's allocation), not looked up again; None
    looks it up."""
    if index is None:
        index = open_index(root, create=create)
        if index is None:
            return False
    try:
        action(index)
        return True
    except IndexCorrupt as exc:
        logger.warning("cast index of {root} is corrupt ({exc}); it will be rebuilt", root=root, exc=exc)
        forget(root)
        remove_database(root)
    except IndexUnavailable as exc:
        logger.debug("cast index of {root} not updated: {exc}", root=root, exc=exc)
    return False
