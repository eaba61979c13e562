"""Crash-safe file primitives: atomic replace, contained paths, JSON-lines logs.

Guarantees
----------
- ``atomic_write_bytes/text/json`` write a temporary file in the *same*
  directory, fsync it, ``os.replace`` it over the target and fsync the
  directory. A reader (or a process restarted after ``kill -9`` or a power
  cut) sees either the complete old content or the complete new content,
  never a mix. A crash may leave a stray ``.<name>.*.tmp`` file beside the
  target; it is never read as the target.
- ``make_durable_dirs(d)`` creates missing directories and fsyncs each new one's
  parent, so a directory made for new files does not vanish in a power cut.
- Every directory castor makes (``make_dir``, ``make_dirs``, ``make_durable_dirs``,
  ``ensure_dir``) asks for :data:`DIR_MODE` (``0755``, less the umask), every file ``0644`` at
  most: nothing castor creates is writable by group or others, whatever the umask (a plain
  ``mkdir`` under ``umask 000`` made run directories anyone could write into). A directory that
  holds what no other user should read (a cast's run directory: its request, prompts, answers)
  is made :data:`PRIVATE_DIR_MODE` (``make_dir(path, PRIVATE_DIR_MODE)``), and so are the directories
  castor makes inside it (``make_durable_dirs(d, PRIVATE_DIR_MODE)``); the files castor writes there
  are created :data:`PRIVATE_FILE_MODE` (``atomic_write_*(..., mode=PRIVATE_FILE_MODE)``), so a run
  directory made wider later (a ``chmod``, a copy, a tarball) still shows no other user its prompts
  and answers. A JSON-lines file castor appends to (a cast's events, a session log) is created ``0600``.
- ``safe_join(root, *parts)`` returns a path that is inside ``root`` after
  symlinks are resolved, or raises :class:`Forbidden`. It refuses ``..``
  components, absolute parts, empty parts and NUL bytes before touching the
  disk, then resolves the result so a symlink inside the root that points
  outside it is refused too. ``confine(root, value)`` is the same rule for one user path
  (a config's ``artifactDir``, ``config.validate``'s ``path``): the decision is
  :mod:`castor.domain.paths`' (pure), the symlink resolution this module's.
  :class:`ConfinedRoot` gives the same answers for many paths under one root,
  resolving the root once and ``lstat``-ing only the components below it.
- ``append_json_line`` appends exactly one complete line per call
  (``append_json_lines``: a batch of complete lines) with a
  single ``write`` on an ``O_APPEND`` descriptor, then fsyncs; a symlink in the
  file's place is refused (``Forbidden``), never appended through. If an earlier
  crash left a torn (newline-less) tail, a newline is written first so the new
  record never fuses with the fragment; an append that fails (a full disk cuts its
  write short) truncates the file back to its old size, so it leaves no fragment
  of its own. ``read_json_lines`` returns every
  parseable line and reports the lines it skipped (torn or corrupt), never
  raising for them.

Failure behaviour
-----------------
- Path violations raise :class:`castor.messages.errors.Forbidden` with
  ``data={"reason": ..., "root": ...}``; the offending part is echoed only
  with control characters escaped.
- OS errors (disk full, permission) propagate as ``OSError``; the target file
  is left untouched and the temporary file is removed where possible.
- Values that are not JSON-serialisable raise ``TypeError``/``ValueError``
  before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import os
import posixpath
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Sequence

# c_make_encoder is the C encoder the json module itself uses; typeshed does not declare it.
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]  # CPython's C JSON encoder; typeshed does not declare it
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeIs  # typing.TypeIs is 3.13+; castor supports 3.11

from castor.domain import paths
from castor.messages.errors import Forbidden, NotFound, StorageUnavailable

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "JsonLinesRead",
    "SkippedLine",
    "append_json_line",
    "append_json_lines",
    "append_json_texts",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "compact_json",
    "ConfinedRoot",
    "DIR_MODE",
    "TooLarge",
    "confine",
    "dump_json",
    "ensure_dir",
    "file_signature",
    "open_without_links",
    "foreign_owner",
    "fsync_dir",
    "make_dir",
    "make_dirs",
    "make_private_dir",
    "make_durable_dirs",
    "one_line_json",
    "read_regular_file",
    "read_json_lines",
    "safe_join",
    "split_text",
    "stat_signature",
    "STORAGE_ERRNOS",
    "is_storage_fault",
    "storage_unavailable",
]


# --------------------------------------------------------------------------- atomic writes


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may be short)."""
    written = os.write(fd, data)
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view):]


def split_text(path: str) -> tuple[str, str]:
    """``os.path.split`` of a plain string path, without its Python-level steps (the write paths
    split several paths per cast transition); the directory of a bare name is ``"."``."""
    head, slash, name = path.rpartition("/")
    return head or slash or ".", name


def stat_signature(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one version of a file from the next: inode, size, mtime and ctime.

    A file replaced by ``rename`` has a new inode (and ctime); one rewritten in place a new
    mtime or size. The caches that skip a re-read while a file is "still the one seen" use it.
    """
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_signature(path: str | os.PathLike[str]) -> tuple[int, int, int, int] | None:
    """:func:`stat_signature` of ``path`` (symlinks followed), or None if it cannot be stat-ed."""
    try:
        return stat_signature(os.stat(path))
    except OSError:
        return None


DIR_MODE = 0o755
"""The mode every directory castor makes asks for (the umask may take more away): writable by
castor's user alone. Under ``umask 000`` a plain ``mkdir`` gives ``0777``, and another user could
then swap a saved cast's ``state.json`` (the commands a trusted recast runs) or plant files in a
run directory; a umask never adds bits, so ``077`` still gives ``0700``."""


PRIVATE_DIR_MODE = 0o700
"""The mode of a directory whose files no other user may read (a cast's run directory, the artifact
root castor makes): a project is often readable by everyone (a home of ``0755``, ``umask 022``), and
a cast's files hold its request, the prompts castor sent (memory recalled into them) and the answers."""

PRIVATE_FILE_MODE = 0o600
"""The mode of a file castor writes inside a private directory (a run directory's files): readable by
castor's user alone even once the directory is made wider (a ``chmod``, a copy, a tarball)."""


def make_dir(path: str | os.PathLike[str], mode: int = DIR_MODE) -> None:
    """``os.mkdir(path)`` with :data:`DIR_MODE` (or ``mode``, e.g. :data:`PRIVATE_DIR_MODE`;
    ``FileExistsError`` when something is there)."""
    os.mkdir(path, mode)


def make_dirs(path: str | os.PathLike[str]) -> None:
    """``path`` and every missing parent made with :data:`DIR_MODE` (``os.makedirs`` gives the
    parents it makes the umask's mode, ``0777`` under ``umask 000``); an existing directory is
    fine, anything else in its place is ``FileExistsError``, as ``os.makedirs(exist_ok=True)``."""
    target = os.fspath(path)
    if os.path.isdir(target):
        return
    parent = os.path.dirname(os.path.abspath(target))
    if parent != os.path.abspath(target):
        make_dirs(parent)
    try:
        os.mkdir(target, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(target):
            raise


def make_private_dir(path: str | os.PathLike[str]) -> None:
    """``path`` made :data:`PRIVATE_DIR_MODE` (its missing parents :data:`DIR_MODE`), as
    :func:`make_dirs`: an existing directory is fine (its mode left as it is), anything else in its
    place is ``FileExistsError``."""
    target = os.fspath(path)
    if os.path.isdir(target):
        return
    make_dirs(os.path.dirname(os.path.abspath(target)))
    try:
        os.mkdir(target, PRIVATE_DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(target):
            raise


def make_durable_dirs(directory: str, mode: int = DIR_MODE) -> None:
    """Create ``directory`` and missing parents (:data:`DIR_MODE`, or ``mode``), fsyncing the parent
    of each one created, so a new directory survives a power cut along with the files later written into it."""
    # mkdir first, not a stat first: a cast transition makes a new directory (a socket's) far more
    # often than it meets one it has not made yet, and a stat that fails costs as much as the mkdir.
    parent = os.path.dirname(directory)
    try:
        os.mkdir(directory, mode)
    except FileExistsError:  # a directory there (or something else: the write into it says so)
        return
    except FileNotFoundError:  # a parent missing: made first (durably), then this one
        if not parent or parent == directory:
            raise
        make_durable_dirs(parent, mode)
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            return
    fsync_dir(parent)


# --------------------------------------------------------------------------- storage faults

#: errnos that mean "this storage cannot take castor's writes (or reads) now": full, over
#: quota, failing, read-only, not permitted. A restart cannot fix any of them.
#: What the storage refuses, that no restart mends: full (``ENOSPC``), over quota (``EDQUOT``), failing
#: (``EIO``), read-only (``EROFS``), forbidden (``EACCES``, ``EPERM``), a file past the size limit
#: (``EFBIG``: ``ulimit -f``), a directory past its link limit (``EMLINK``), or a path longer than the
#: file system takes (``ENAMETOOLONG``: a project near ``PATH_MAX``, whose deepest files do not fit).
#: And no descriptor to open the file with (``EMFILE``: the process's ``ulimit -n``; ``ENFILE``: the
#: system's): not the disk's fault, but a restart meets it again at once, and a file that could not
#: be opened is no sign that the document in it is damaged.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM,
                            errno.EFBIG, errno.EMLINK, errno.ENAMETOOLONG, errno.EMFILE, errno.ENFILE})


def _name_target(exc: BaseException, target: str) -> None:
    """Name the file a failed write was for (``os.write``/``fsync`` errors carry no name)."""
    if isinstance(exc, OSError) and exc.filename is None:
        try:
            exc.filename = target
        except (AttributeError, TypeError):  # pragma: no cover - every OSError allows it
            pass


#: errnos of a file that could not be opened for want of a descriptor (the process's ``ulimit -n``,
#: the system's table): the process's shortage, never a sign that the file is bad -- a reader that
#: tolerates bad files (ignores or reports them) answers ``storage_unavailable`` for these instead.
NO_DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def is_storage_fault(exc: BaseException) -> TypeIs[OSError]:
    """True for an ``OSError`` whose errno is one of :data:`STORAGE_ERRNOS`."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


#: The temporary file :func:`atomic_write_bytes` writes before its rename: ``.NAME.PID.TAGSEQ.tmp``.
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.\d+\.[0-9a-f]+\.tmp")


def temp_target(name: str) -> str | None:
    """The file name an atomic write's temporary file ``name`` stands for; None for any other name."""
    match = _TEMP_NAME.fullmatch(name)
    return match["name"] if match is not None else None


def shown_target(path: str) -> str:
    """``path``, or the file an atomic write's temporary file at ``path`` stood for: an error names
    the file the user knows (``settings.json``), not the write's scaffolding."""
    directory, _sep, base = path.rpartition("/")
    name = temp_target(base)
    if name is None:
        return path
    return f"{directory}/{name}" if _sep else name


def shown_path(target: str | bytes | os.PathLike[str] | int, base: str | os.PathLike[str] | None) -> str:
    """How an error names a file: text (bytes decoded), an atomic write's temporary file as the
    file it stood for, relative to ``base`` (the project) when it lies inside it."""
    shown = target if isinstance(target, str) else (
        target.decode("utf-8", "backslashreplace") if isinstance(target, bytes) else
        str(target) if isinstance(target, int) else os.fspath(target))
    shown = shown_target(shown)
    if base is not None:
        try:
            shown = Path(shown).relative_to(base).as_posix()
        except ValueError:
            pass
    return shown


def storage_unavailable(exc: OSError, *, path: str | os.PathLike[str] | None = None,
                        base: str | os.PathLike[str] | None = None, action: str = "write") -> StorageUnavailable:
    """The typed error (code ``storage_unavailable``) for a file-system error.

    ``data``: ``errno`` (its name, ``ENOSPC``...; ``EUNKNOWN`` when the error has none) and
    ``path`` (the file named by the error, else ``path``), relative to ``base`` (the project)
    when it lies inside it. The message says what to do, never holds file contents.
    """
    name = errno.errorcode.get(exc.errno or -1, "EUNKNOWN")
    target = exc.filename if exc.filename is not None else path
    shown = None if target is None else _printable(shown_path(target, base))
    where = f" on {shown}" if shown else ""
    data: dict[str, Any] = {"errno": name}
    if shown is not None:
        data["path"] = shown
    return StorageUnavailable(f"storage unavailable: cannot {action}{where} ({name}: "
                              f"{exc.strerror or 'error'})", data=data)


class TooLarge(ValueError):
    """A file over the bound its reader gave (``read_regular_file``'s ``max_bytes``), refused unread."""


class UnsafeFile(ValueError):
    """A file castor found by itself that another user chose the content of (see ``owned``)."""


def foreign_owner(path: str | os.PathLike[str]) -> str | None:
    """Why another user may have chosen what the file at ``path`` says (links followed): it is
    theirs (root's aside), or every user may write it; None when it is castor's user's (or root's)
    alone, or cannot be looked at. For project files that decide what castor runs even when the
    project is trusted: trusting a project trusts its owner, not whoever else could write there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid not in (os.geteuid(), 0):
        return f"it belongs to another user (uid {st.st_uid})"
    if st.st_mode & stat.S_IWOTH:
        return "every user may write it"
    return None


_DIRECTORY_STEP = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_without_links(path: str | os.PathLike[str], flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path`` (absolute, as castor resolved it) opened one component at a time
    from ``/``, each directory by a descriptor of its parent, no component followed if it is a
    symbolic link (``O_NOFOLLOW``), the last one too (``flags``, with ``O_NONBLOCK``: a FIFO is
    never waited on). What is opened is the path as named, whatever is swapped in on the way
    meanwhile: a directory replaced by a link mid-path (to anywhere) cannot lead the open out.

    A link met on the way, the last component included, is ``OSError`` ``ELOOP`` whose
    ``filename`` is the path up to that link; a missing component ``FileNotFoundError``; a file
    where a directory belongs ``NotADirectoryError``. For castor's reads of paths it resolved
    itself (an artifact root, a run directory), where no component can be a link unless one was
    planted since."""
    text = os.path.normpath(os.path.abspath(os.fspath(path)))
    parts = [part for part in text.split("/") if part]
    if not parts:
        return os.open("/", flags | os.O_NONBLOCK | os.O_CLOEXEC)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            try:
                opened = os.open(part, (flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC) if last
                                 else _DIRECTORY_STEP, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    # O_NOFOLLOW on a link: ELOOP as the last part (EMLINK on FreeBSD), ENOTDIR
                    # with O_DIRECTORY on the way; told apart from a file in a directory's place
                    try:
                        linked = stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode)
                    except OSError:
                        linked = False
                    if linked:
                        raise OSError(errno.ELOOP, "a symbolic link, which castor does not follow",
                                      "/" + "/".join(parts[:index + 1])) from None
                raise
            os.close(fd)
            fd = opened
            if last:
                return fd
    except BaseException:
        os.close(fd)
        raise
    raise AssertionError("unreachable")  # the loop returns at its last part


def read_regular_file(path: str | os.PathLike[str], max_bytes: int | None, *, owned: bool = False,
                      follow_links: bool = True, links_on_the_way: bool = True) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (None: any size, for castor's own files);
    ``ValueError`` for anything else.

    Opened first, then checked (what is checked is what is read), with ``O_NONBLOCK`` so a FIFO
    is refused at once instead of waiting for a writer; ``/dev/zero`` and other devices are
    refused too. For user-edited files (configs, settings) whose path a project can choose.
    ``owned``: the file must also be castor's user's (or root's) and not writable by every user,
    else :class:`UnsafeFile` -- for the user's own config that castor finds through the
    environment and that chooses what it runs (a shared or mistyped directory would let another
    user choose it). ``follow_links=False``: a symbolic link as the file's own name is not followed
    (``OSError`` ``ELOOP``) -- for a file castor keeps inside a directory of its own, where a link
    could only have been planted to lead it elsewhere. ``links_on_the_way=False``: no component of
    the path is followed if it is a link (:func:`open_without_links`, ``OSError`` ``ELOOP``) -- for a
    path castor resolved itself, where a directory swapped for a link since would lead the read out.
    """
    if not links_on_the_way:
        fd = open_without_links(path)
    else:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    mode = st.st_mode
    if not stat.S_ISREG(mode):  # checked on the fd: a directory cannot even be wrapped (its error names the fd)
        os.close(fd)
        raise ValueError("a directory" if stat.S_ISDIR(mode) else "not a regular file")
    if owned and st.st_uid not in (os.geteuid(), 0):
        os.close(fd)
        raise UnsafeFile(f"it belongs to another user (uid {st.st_uid}), who chose what it says")
    if owned and mode & stat.S_IWOTH:
        os.close(fd)
        raise UnsafeFile("every user may write it, so another user may have chosen what it says (chmod o-w it)")
    if max_bytes is not None and st.st_size > max_bytes:  # refused unread (a sparse file costs no disk)
        os.close(fd)
        raise TooLarge(f"larger than {max_bytes} bytes")
    with open(fd, "rb") as handle:
        if max_bytes is None:
            raw = handle.read()
        else:
            # Sized to the file, not the bound: a read of n bytes allocates n first (a 256 MiB
            # bound made every state read map and unmap 256 MiB: ~120 us of a 32 KB read).
            want = st.st_size + 1
            raw = handle.read(want)
            if len(raw) == want:  # grown since the fstat: read on, up to one byte past the bound
                raw += handle.read(max_bytes + 1 - want)
    if max_bytes is not None and len(raw) > max_bytes:  # grown since the fstat
        raise TooLarge(f"larger than {max_bytes} bytes")
    return raw


def ensure_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents, :data:`DIR_MODE`) if missing and return it as a Path."""
    p = Path(path)
    make_dirs(p)
    return p


_TEMP_SEQ = itertools.count()  # next() on a count is atomic under the GIL
_TEMP_TAG = secrets.token_hex(4)  # per process: pids repeat across hosts sharing a directory
_TEMP_PREFIX = [f"{os.getpid()}.{_TEMP_TAG}"]  # no getpid() per write; a forked child gets its own
os.register_at_fork(after_in_child=lambda: _TEMP_PREFIX.__setitem__(0, f"{os.getpid()}.{_TEMP_TAG}"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, keep_mode: bool = False,
                       sync_dir: bool = True, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably (see module doc).

    The new file is created ``mode`` (less the umask; :data:`PRIVATE_FILE_MODE` for a run
    directory's files). ``keep_mode`` gives it the permission bits of the one it
    replaces instead (for files a user owns, like Pi's settings.json). ``sync_dir=False``
    leaves the directory fsync to the caller, who batches several replacements in one
    directory behind one :func:`fsync_dir` (the replacement is durable only after it).
    """
    # Plain string paths: this runs several times per cast transition (pathlib is slow here).
    target = os.fspath(path)
    directory, name = split_text(target)
    # The temp name is unique per call (pid, a random tag per process, a counter) so concurrent
    # writers, in this process or another, never share one.
    tmp = f"{directory}/.{name}.{_TEMP_PREFIX[0]}{next(_TEMP_SEQ)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            if keep_mode:
                try:
                    os.fchmod(fd, os.stat(target).st_mode & 0o7777)
                except FileNotFoundError:
                    pass
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        _name_target(exc, target)
        raise
    if sync_dir:
        fsync_dir(directory)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      keep_mode: bool = False, mode: int = 0o644) -> None:
    """Atomically replace ``path`` with ``text`` encoded as ``encoding``."""
    atomic_write_bytes(path, text.encode(encoding), keep_mode=keep_mode, mode=mode)


def _strict_one_line_encoder(item_separator: str, key_separator: str) -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, allow_nan=False, separators=...)``, made once.

    ``JSONEncoder.encode`` builds json's C encoder again on every call (a few dozen lines of
    Python per call, several calls per cast transition); this builds it once and calls it. One
    difference: no circular-reference bookkeeping (castor's records are trees), so a cycle ends in
    ``RecursionError`` instead of ``ValueError`` — before anything is written either way.
    """
    fallback = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(item_separator, key_separator))
    if c_make_encoder is None:  # no C accelerator (another interpreter): json's own path
        return fallback.encode
    encode = c_make_encoder(None, fallback.default, encode_basestring, None, key_separator, item_separator,
                            False, False, False)

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


compact_json = _strict_one_line_encoder(",", ":")
compact_json.__doc__ = """Strict JSON on one line without spaces (``json.dumps(..., separators=(",", ":"))``)."""
one_line_json = _strict_one_line_encoder(", ", ": ")
one_line_json.__doc__ = """Strict JSON on one line with json's default ``", "``/``": "`` spacing."""


def dump_json(value: Any, *, indent: int | None = 2) -> str:
    """Serialise ``value`` as strict JSON (no NaN/Infinity), UTF-8 kept as is."""
    return json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False)


def atomic_write_json(path: str | os.PathLike[str], value: Any, *, indent: int | None = 2,
                      mode: int = 0o644) -> None:
    """Atomically replace ``path`` with ``value`` as JSON plus a trailing newline.

    Serialisation happens first, so an unserialisable value writes nothing.
    """
    atomic_write_text(path, dump_json(value, indent=indent) + "\n", mode=mode)


# --------------------------------------------------------------------------- contained paths


def _printable(part: str) -> str:
    return part.encode("unicode_escape", "backslashreplace").decode("ascii")[:200]


def _refuse(reason: str, root: str | Path, part: str | None = None) -> Forbidden:
    data: dict[str, Any] = {"reason": reason, "root": str(root)}
    if part is None:
        return Forbidden(f"path refused ({reason}) under {root}", data=data)
    data["part"] = _printable(part)  # named: which file to look at (a planted link)
    return Forbidden(f"path refused ({reason}) under {root}: {data['part']}", data=data)


def _check_part(root: str | Path, part: str | os.PathLike[str]) -> str:
    text = os.fspath(part)
    reason = paths.refusal(text)  # the one rule (castor.domain.paths)
    if reason is not None:
        raise _refuse(reason, root, text if isinstance(text, str) else repr(text))
    return text


def confine(root: str | os.PathLike[str], value: str, *, allow_absolute: bool = False) -> Path:
    """The real location of the user path ``value`` under ``root``, or ``Forbidden``.

    :mod:`castor.domain.paths` decides first, without touching the disk (NUL, empty, ``..``,
    absolute — allowed with ``allow_absolute`` only when it lies inside the root); then the
    path is resolved (``realpath``: ``lstat``/``readlink`` of its components, never an
    ``open`` of the target) and refused if a symlink takes it outside the resolved root.
    Nothing is read, created or opened, so a refusal leaks nothing about what lies outside.
    """
    root_resolved = os.path.realpath(os.fspath(root))
    lexical_root = os.path.normpath(os.path.abspath(os.fspath(root)))
    target, reason = paths.lexical_target(lexical_root, value, allow_absolute=allow_absolute)
    if target is None and reason == paths.REASON_OUTSIDE and lexical_root != root_resolved:
        target, reason = paths.lexical_target(root_resolved, value, allow_absolute=allow_absolute)
    if target is None:
        raise _refuse(reason or paths.REASON_OUTSIDE, root_resolved, value if isinstance(value, str) else repr(value))
    resolved = os.path.realpath(target)
    if not paths.inside(root_resolved, resolved):
        raise _refuse(paths.REASON_SYMLINK, root_resolved, value)
    return Path(resolved)


def safe_join(root: str | os.PathLike[str], *parts: str | os.PathLike[str]) -> Path:
    """Join ``parts`` under ``root``; raise Forbidden if the result could leave it.

    The returned path is absolute and symlink-resolved where it exists. Parts
    may contain ``/`` separators (``"sockets/Socket-1/1.md"``) as long as no
    component is ``..``.
    """
    root_resolved = Path(root).resolve()
    checked = [_check_part(root_resolved, p) for p in parts]
    joined = root_resolved.joinpath(*checked)
    resolved = joined.resolve()
    if not paths.inside(str(root_resolved), str(resolved)):
        raise _refuse(paths.REASON_SYMLINK, root_resolved, "/".join(checked))
    return resolved


class ConfinedRoot:
    """:func:`safe_join` for many paths under one root, without re-resolving the root each time.

    ``join(relative)`` returns what ``safe_join(root, relative)`` returns, with the same
    refusals (NUL, empty, absolute, ``..``, a symlink leading outside). The root is resolved
    once; below it every existing component is checked with one ``lstat`` on every call, and
    a path that meets a symlink goes through the full ``safe_join``. So a path built from
    config, ids or model output never leaves the root, and a symlink planted inside it later
    is seen by the next call — at a few ``lstat`` calls instead of a ``realpath`` of the whole
    absolute path. ``join_text`` is the same answer as a string (the cast hot path: several
    writes per transition, and pathlib's parsing costs more than the checks themselves).
    """

    def __init__(self, root: str | os.PathLike[str], *, resolved: bool = False) -> None:
        # resolved=True: the caller passes a path it already resolved (or one this class
        # returned), so the realpath walk of a deep root is not paid again (nor pathlib's parse:
        # a cast's start makes several of these; ``root`` is made when first asked for).
        text = os.fspath(root) if resolved else str(Path(root).resolve())
        if "//" in text or "/./" in text or text.endswith(("/", "/.")) or not text.startswith("/"):
            text = str(Path(text))  # pathlib's spelling of what it was given (a resolved path already has it)
        self._prefix = text.rstrip("/")  # "" for "/", so joins never double the slash
        self._label = self._prefix or "/"  # the root as refusals name it

    @functools.cached_property
    def root(self) -> Path:
        return Path(self._label)

    @property
    def text(self) -> str:
        """The root as a string (what :attr:`root` spells)."""
        return self._label

    def check(self, relative: str) -> str:
        """The refusals of :meth:`join` that need no disk access (NUL, empty, absolute, ``..``)."""
        return _check_part(self._label, relative)

    def join(self, relative: str) -> Path:
        return Path(self.join_text(relative))

    def join_text(self, relative: str) -> str:
        return self.join_checked_text(_check_part(self._label, relative))

    def join_checked_text(self, text: str) -> str:
        """:meth:`join_text` of a ``text`` that :meth:`check` has already passed (the same text, or
        a path castor derived from it that cannot add ``..``, NUL, an empty or absolute part): the
        containment walk (``lstat`` of each existing component) without repeating the text checks."""
        parts = text.split("/")
        if "" in parts or "." in parts:
            return str(safe_join(self.root, text))  # unusual spellings: the general path
        current = self._prefix
        lstat = os.lstat
        for index, part in enumerate(parts):
            current = f"{current}/{part}"
            try:
                mode = lstat(current).st_mode
            except OSError:
                # Nothing exists from here on (or it cannot: too long, not a directory), so
                # nothing below can be a symlink yet; using the path fails as it would anyway.
                rest = parts[index + 1:]
                return "/".join([current, *rest]) if rest else current
            if stat.S_ISLNK(mode):
                return str(safe_join(self.root, text))
        return current


# --------------------------------------------------------------------------- JSON lines


class SkippedLine(BaseModel):
    """A line ``read_json_lines`` could not use: its 1-based number and why."""

    model_config = ConfigDict(frozen=True)

    line_no: int
    reason: str
    torn_tail: bool = False


class JsonLinesRead(BaseModel):
    """Result of reading a JSON-lines file: usable records and skipped lines."""

    model_config = ConfigDict(frozen=True)

    records: list[Any]
    skipped: list[SkippedLine]

    @property
    def torn_tail(self) -> bool:
        return any(s.torn_tail for s in self.skipped)


def _tail_is_torn(fd: int, size: int) -> bool:
    """Whether the file of ``fd`` (``size`` bytes, from the caller's ``fstat``) ends in a torn line."""
    if size == 0:
        return False
    return os.pread(fd, 1, size - 1) != b"\n"


def append_json_line(path: str | os.PathLike[str], record: Any) -> None:
    """Append ``record`` as one compact JSON line, flushed and fsynced.

    Not safe against *concurrent* appenders of the same file across threads on
    its own; callers serialise appends per file (``CastArtifacts`` does).
    """
    append_json_lines(path, [record])


def append_json_lines(path: str | os.PathLike[str], records: Sequence[Any]) -> None:
    """Append each of ``records`` as one compact JSON line: one ``write``, one fsync.

    All lines are serialised before anything is written (an unserialisable
    record writes nothing). A crash mid-write can leave only a torn *last*
    line, which readers skip and the next append seals (see the module doc).
    Same caller-side serialisation rule as :func:`append_json_line`.
    """
    append_json_texts(path, [compact_json(record) for record in records])


def append_json_texts(path: str | os.PathLike[str], lines: Sequence[str]) -> None:
    """:func:`append_json_lines` of records the caller has already made into compact JSON texts,
    one per line (castor's event log writes its lines' fixed fields itself): the same single
    ``write``, fsync, refusals and torn-tail sealing. A text holding a newline appends nothing
    (``ValueError``), nor does one UTF-8 cannot hold (``UnicodeEncodeError``)."""
    if not lines:
        return
    for line in lines:
        if "\n" in line:  # impossible for compact JSON; kept as a guard for the invariant
            raise ValueError("JSON line contains a newline")
    payload = ("\n".join(lines) + "\n").encode("utf-8")
    try:
        # O_NOFOLLOW: a log is castor's own file; a symlink planted in its place (to a file
        # outside the project) is refused, never appended through.
        # O_NONBLOCK: a FIFO planted in its place must not block the write (it is refused below).
        fd = os.open(os.fspath(path),
                     os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)  # a cast's events, a session log: what its prompts and answers said
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise Forbidden(f"refusing to append through a symlink: {_printable(os.fspath(path))}",
                        data={"reason": "symlink", "path": _printable(os.fspath(path))}) from None
    try:
        info = os.fstat(fd)  # one fstat: what kind of file, and its size for the torn-tail check
        if not stat.S_ISREG(info.st_mode):
            raise Forbidden(f"refusing to append to {_printable(os.fspath(path))}: not a regular file",
                            data={"reason": "not_a_regular_file", "path": _printable(os.fspath(path))})
        if _tail_is_torn(fd, info.st_size):
            # Seal the torn fragment as its own (invalid) line.
            payload = b"\n" + payload
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        except OSError:
            # A full disk cuts a write short (the file's last page fills, then ENOSPC): take the
            # bytes back, so a failed append leaves no torn line for the next one to seal.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, info.st_size)
            raise
    except OSError as exc:
        _name_target(exc, os.fspath(path))
        raise
    finally:
        os.close(fd)


def _parse_lines(raw: bytes) -> Iterable[tuple[int, bytes, bool]]:
    lines = raw.split(b"\n")
    last_index = len(lines) - 1
    for index, line in enumerate(lines):
        is_last = index == last_index
        if is_last and line == b"":
            continue  # the normal end after a final newline
        yield index + 1, line, is_last


def read_json_lines(path: str | os.PathLike[str], max_bytes: int | None = None) -> JsonLinesRead:
    """Read every parseable JSON line of ``path``; report the rest.

    A final line without a newline is never accepted, even if it happens to
    parse: only a line whose newline was written is complete. A missing file
    reads as empty. A file over ``max_bytes`` raises :class:`TooLarge`, unread.
    """
    try:
        raw = read_regular_file(path, max_bytes)  # a FIFO or a directory: refused, not waited on
    except FileNotFoundError:
        return JsonLinesRead(records=[], skipped=[])
    except TooLarge:
        raise
    except ValueError:
        raise Forbidden(f"refusing to read {_printable(os.fspath(path))}: not a regular file",
                        data={"reason": "not_a_regular_file", "path": _printable(os.fspath(path))}) from None
    records: list[Any] = []
    skipped: list[SkippedLine] = []
    for line_no, line, is_last in _parse_lines(raw):
        if is_last:
            skipped.append(SkippedLine(line_no=line_no, reason="torn last line (no newline)", torn_tail=True))
            continue
        if not line.strip():
            skipped.append(SkippedLine(line_no=line_no, reason="blank line"))
            continue
        try:
            records.append(json.loads(line.decode("utf-8")))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors;
            # a line nested past the recursion limit or with an integer past 4300 digits is skipped too
            skipped.append(SkippedLine(line_no=line_no, reason=f"invalid JSON: {exc.__class__.__name__}"))
    return JsonLinesRead(records=records, skipped=skipped)


def read_last_json_line(path: str | os.PathLike[str], window: int = 64 * 1024) -> Any:
    """The last complete line of the JSON-lines file ``path``, parsed, reading at most its last
    ``window`` bytes (a log of any length costs one bounded read); None when there is none in that
    window, the last complete line is not JSON, or the file is missing. A torn last line (no
    newline) is not a line, as for :func:`read_json_lines`; a FIFO or a directory is ``ValueError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        start = max(0, st.st_size - window)
        tail = os.pread(fd, st.st_size - start, start)
    finally:
        os.close(fd)
    lines = tail.split(b"\n")[:-1]  # the part after the last newline is torn (or empty)
    if start > 0:
        lines = lines[1:]  # the window's first line began before it
    for line in reversed(lines):
        if line.strip():
            try:
                return json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError):
                return None
    return None


def check_project_dir(cwd: str) -> None:
    """A session's ``cwd`` is its project: an absolute path to an existing directory. Anything
    else is refused before a session exists (the path rule is :func:`castor.domain.paths.check_project_path`;
    a missing directory is ``not_found`` here, since the first cast would otherwise create it)."""
    paths.check_project_path(cwd)
    if not os.path.isdir(cwd):
        raise NotFound(f"cwd {cwd[:200]} is not an existing directory", data={"cwd": cwd[:200]})


def project_artifact_root(cwd: str, configured: str | None) -> Path:
    """A project's artifact root: ``configured`` (default ``.pi/pi-materia``) resolved against the
    project, symlinks included; ``forbidden`` unless it stays inside the project (the one rule of
    castor.domain.paths: no ``..``, an absolute path only inside the project)."""
    project = Path(cwd).resolve()
    wanted = configured or paths.DEFAULT_ARTIFACT_DIR
    try:
        return confine(project, wanted, allow_absolute=True)
    except Forbidden as exc:
        link = _link_leading_out(project, wanted) if exc.data.get("reason") == paths.REASON_SYMLINK else None
        raise paths.artifact_dir_outside(wanted, str(project), exc, link) from None


def _link_leading_out(project: Path, wanted: str) -> tuple[str, str] | None:
    """The first symbolic link on the way from ``project`` to ``wanted`` (relative, or absolute
    inside it) whose target lies outside ``project``: ``(its path relative to the project, its
    resolved target)``; None if none is found (the path changed meanwhile)."""
    relative = wanted
    if posixpath.isabs(wanted):
        relative = posixpath.relpath(posixpath.normpath(wanted), str(project))
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:  # (a project reached through a link of its own: not this walk's to name)
        return None
    at = project
    for part in parts:
        at = at / part
        if at.is_symlink():
            target = os.path.realpath(at)
            if not paths.inside(str(project), target):
                return str(at.relative_to(project)), target
    return None
