"""An OS-level lease on one cast: "a live runtime is running this cast right now".

``CastLease.try_acquire(artifact_root, cast_id)`` takes an exclusive, non-blocking
``flock`` on ``<artifactRoot>/<castId>/owner.lock`` and keeps the descriptor open.

Guarantees
----------
- At most one holder at a time, across threads *and* processes (``flock`` locks an
  open file description, so even two leases in one process exclude each other).
- The kernel drops the lease when its holder dies — ``kill -9`` included — so an
  *active* cast whose lease is free was orphaned by a dead runtime and may be resumed.
- A run directory castor's user owns is kept to that user when its lease is taken
  (:func:`keep_run_dir_private`: one an older castor or pi-materia left ``0755`` becomes ``0700``);
  a new cast's, made ``0700`` by its allocation a moment before, is not looked at again (``fresh``).
- ``release()`` is idempotent. The lock file is never deleted (deleting it would let
  two holders lock two different inodes).

Failure behaviour: hostile cast ids raise ``Forbidden`` (via ``ConfinedRoot``); a lease
held by someone else makes ``try_acquire`` return ``None``; a symbolic link in place of the lock
file (never followed: it would lead out of the run directory) raises ``StateCorrupt`` naming it and
saying what to do (:func:`link_in_place_of_the_lease`), from the probe as from ``try_acquire``; so
does a directory in its place, from ``try_acquire`` (:func:`directory_in_place_of_the_lease`);
other OS errors propagate.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from pathlib import Path
from typing import Any

from castor.adapters.fs import ConfinedRoot, make_private_dir
from castor.adapters.materia.artifacts import validate_cast_id
from castor.ports.cast_storage import StateCorrupt

LEASE_FILE = "owner.lock"


def link_in_place_of_the_lease(cast_id: str, path: str | os.PathLike[str]) -> StateCorrupt:
    """The error for a symbolic link where a cast's lease file must be. Removing the link is what
    mends it: the next command makes a fresh lock file (a runtime that held the old one keeps its
    claim on the state, which fences any second holder). A recast alone would meet the link again."""
    return _lease_file_damaged(cast_id, path, "a symbolic link, which castor never follows", "the link",
                               "lease_file_is_a_link")


def directory_in_place_of_the_lease(cast_id: str, path: str | os.PathLike[str]) -> StateCorrupt:
    """The error for a directory where a cast's lease file must be (no lock can be taken on it for
    writing): removing it mends it, as for a link (:func:`link_in_place_of_the_lease`)."""
    return _lease_file_damaged(cast_id, path, "a directory", "that directory", "lease_file_is_a_directory")


def _lease_file_damaged(cast_id: str, path: str | os.PathLike[str], what: str, it: str, reason: str) -> StateCorrupt:
    return StateCorrupt(f"cast {cast_id}'s run directory is damaged: its lease file {os.fspath(path)} is {what}; "
                        f"remove {it} (castor makes a fresh lock file), then run the command again",
                        data={"cast_id": cast_id, "path": os.fspath(path), "reason": reason})


def _open_lease_file(cast_id: str, path: str | os.PathLike[str], flags: int) -> int:
    try:
        return os.open(path, flags, 0o600)  # a run directory's files are castor's user's alone
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link as the last component
            raise link_in_place_of_the_lease(cast_id, path) from None
        if exc.errno == errno.EISDIR:  # opened for writing (a probe's read-only open of one works)
            raise directory_in_place_of_the_lease(cast_id, path) from None
        raise


def keep_run_dir_private(run_dir: str) -> None:
    """Take group and other permissions off ``run_dir`` (its owner's bits kept: ``0755`` becomes
    ``0700``) when castor's own user owns it: a run directory an older castor or pi-materia made is
    ``0755``, and the prompts and answers a recast, revive or continue writes there would be
    readable by every local user. The directory is opened ``O_NOFOLLOW | O_DIRECTORY`` and changed
    through that descriptor (``fchmod``): a link in its place is never followed, and a directory of
    another user is left as it is (its mode is not castor's to change). Nothing to do costs one
    open and one ``fstat``."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:  # a link or something else in its place: the lease's own checks say so, or it is left
        return
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid == os.geteuid() and mode & 0o077:
            os.fchmod(fd, mode & 0o700)
    except OSError:  # a read-only file system: nothing castor writes there either
        pass
    finally:
        os.close(fd)


def lease_holder(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The process that holds the lease of the cast in ``run_dir`` (``pid``, and ``command``: its
    command line, ``""`` when it cannot be read), found in ``/proc/locks`` by the lock file's device
    and inode; None where that cannot be told (no ``/proc``, not Linux, a holder in another pid
    namespace, or the lease freed meanwhile). Read only: it takes no lock."""
    try:
        st = os.stat(Path(run_dir) / LEASE_FILE, follow_symlinks=False)
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            table = locks.read()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields[:2] or len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != device:
            continue  # a waiter (``->``), another kind of lock, or another file
        try:
            pid = int(fields[4])
        except ValueError:
            return None
        if pid <= 0:
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = " ".join(arg.decode("utf-8", "backslashreplace")
                                   for arg in cmdline.read().split(b"\0") if arg)
        except OSError:
            command = ""
        return {"pid": pid, "command": command}
    return None


class CastLease:
    """A held lease; call :meth:`release` when the cast leaves this runtime."""

    def __init__(self, path: str | Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._lock = threading.Lock()

    @classmethod
    def try_acquire(cls, artifact_root: str | os.PathLike[str], cast_id: str, *,
                    root_resolved: bool = False, fresh: bool = False) -> CastLease | None:
        """``root_resolved``: ``artifact_root`` is already symlink-resolved (``Runtime.artifact_root_for``).
        ``fresh``: the run directory is one this process has just made (``allocate_cast_id``: an
        exclusive ``mkdir`` with mode ``0700``, which a umask can only narrow), so it is private from
        its creation and :func:`keep_run_dir_private` has nothing to do (its open, ``fstat`` and
        close are skipped); everything else -- the containment walk, ``O_NOFOLLOW``, the lock -- is
        the same."""
        run_dir = ConfinedRoot(artifact_root, resolved=root_resolved).join_text(validate_cast_id(cast_id))
        path = f"{run_dir}/{LEASE_FILE}"
        # O_NOFOLLOW: a link planted in its place would open (O_CREAT: create) a file outside the
        # project; it fails ELOOP instead. O_NONBLOCK: nothing in its place is ever waited on.
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = _open_lease_file(cast_id, path, flags)
        except FileNotFoundError:  # the run dir is not there yet (a fresh id allocates it first)
            make_private_dir(run_dir)
            fd = _open_lease_file(cast_id, path, flags)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if fresh:
            return cls(path, fd)
        try:
            keep_run_dir_private(run_dir)
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        return cls(path, fd)

    @classmethod
    def is_held(cls, artifact_root: str | os.PathLike[str], cast_id: str) -> bool:
        """True if some live holder has the lease now. A read-only probe (lock and unlock a
        descriptor of its own): it creates nothing and needs no write permission. A link in place
        of the lock file is ``StateCorrupt`` (:func:`link_in_place_of_the_lease`)."""
        run_dir = ConfinedRoot(artifact_root).join_text(validate_cast_id(cast_id))
        try:
            # O_NONBLOCK: a FIFO planted in its place must not hold the probe (castor casts, status)
            # until a writer comes; O_NOFOLLOW: a link is never followed out of the run directory
            fd = _open_lease_file(cast_id, Path(run_dir) / LEASE_FILE,
                                  os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False  # never leased
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
