"""The Icarus worker: the program the bridge's Python subprocess runs.

It is launched by file path (``<python> -u <this file>``) with the interpreter the
*trusted* settings chose, so it must not import anything from castor and must
run on any CPython >= 3.8 (the plugin's own venv may be older than castor's).

Guarantees
----------
- **Import hygiene.** The very first statement imports only ``sys`` (a builtin
  that cannot be shadowed). Before any other import the current-directory
  entries (``''``, ``'.'``, any relative entry, the cwd itself) and this
  script's own directory are removed from ``sys.path``, so a ``json.py`` in the
  project cannot replace the standard library.
- **Exact package.** The package ``icarus`` is loaded from the directory named
  by ``CASTOR_ICARUS_DIR`` via its ``__init__.py`` with
  ``submodule_search_locations=[that dir]``; any ``icarus`` module already in
  ``sys.modules`` is dropped first. Another ``icarus`` on ``sys.path`` is never
  used. Import errors surface per call as ``ok: false``.
- **No code from outside the directory.** A finder first on ``sys.meta_path``
  finds ``icarus`` and every ``icarus.*`` module (the backend's own imports
  too) and resolves the real path of its file, its bytecode cache and its
  search path *before* the module's code runs; anything outside the directory
  (a symlink out, a symlinked sub-directory, ``__init__.py`` or
  ``__pycache__``) is refused: the reply is ``ok: false`` with ``refused:
  "outside_package"`` and ``module``. A module is checked once, when it is
  first resolved; later calls find it in a table (no path resolution per call).
- **stdout is the protocol alone.** At start the real fd 1 is duplicated to a
  private fd used only for replies, fd 1 is pointed at stderr (so native writes
  from C extensions land on stderr) and ``sys.stdout`` is ``sys.stderr``.
  fd 0 is likewise moved away and replaced by ``/dev/null`` so backend code
  cannot consume protocol lines.
- **Ready line.** Once stdout is isolated, and before any request is read, the
  program writes ``READY_LINE``. Whatever the pipe carries before it is not the
  program's (an interpreter's ``sitecustomize`` or a wrapper script printing a
  banner): the parent reads up to the ready line and drops the rest, so it never
  lands in the first call's reply.
- **Protocol.** One JSON object per line. Request
  ``{id, module, function, args?, kwargs?}``; reply ``{id, ok: true, result}``
  or ``{id, ok: false, error, traceback}``. Requests run one at a time, to
  completion, in arrival order. A malformed line gets ``ok: false`` with the
  id echoed when it could be read (else ``null``) and the loop keeps running.
- **Normalisation.** A ``str`` result whose stripped text starts with ``{`` or
  ``[`` is replaced by its parsed JSON when it parses; otherwise the original
  string is returned unchanged. A parsed text that is ASCII, on one line and
  holds no NaN or infinity is written on the reply line as it is (not encoded
  again: the parent parses it to the same values).
- **Serialisation.** ``ensure_ascii=False``, ``default=str``, ``allow_nan=False``;
  a result that still cannot be serialised yields ``ok: false, error:
  "unserializable result"``.
- End of stdin ends the worker with exit code 0.
- **What it began.** Before it handles a request line it counts it in the page castor shares
  (``CASTOR_WORKER_BEGUN_FD``: one unsigned 64-bit slot; a memory store, no system call). A
  worker killed after its read took the request from the pipe but before it began it (a
  ``kill -9`` that landed while it waited idle: the kernel hands the read its bytes, then ends
  the process) leaves the count one short, and castor knows the request never ran.
- **It does not outlive its parent.** A thread waits for the request pipe's hang-up (every
  writer gone). A parent that closed the pipe and lives on gets what it asked for: the requests
  left run to their end and the worker exits 0 at the end of the pipe, as ever. Once the parent
  itself is gone (the worker is handed to another parent: kill -9 included), a worker still
  running kills its process group -- itself and whatever the backend started in it -- when it
  leads that group (the bridge starts it so), else itself. Without it a castor killed during a
  hung call left the worker, and its children, running. The parent is also gone when the castor
  named by ``CASTOR_WORKER_PARENT`` no longer exists: one that died before the worker ran at all
  left it the reaper's child from the start, and a busy worker then ran on for ever.

Environment: ``CASTOR_ICARUS_DIR`` (required, absolute); the backend's own
identity/path variables (``FABRIC_DIR``, ``HERMES_AGENT_NAME``,
``FABRIC_PROJECT_ID``, ``HERMES_HOME``, ``STATE_DB_PATH``) are set by the bridge
and read by the plugin itself at import time.
"""
import sys


def _scrub_sys_path() -> None:
    """Drop cwd-like, relative and script-dir entries. Uses only builtins.

    ``os`` is already imported by interpreter start-up, so taking it from
    ``sys.modules`` cannot load a shadowing file.
    """
    _os = sys.modules.get("os")
    cwd = _os.getcwd() if _os is not None else None
    script_dir = _os.path.dirname(_os.path.abspath(__file__)) if _os is not None else None
    kept = []
    for entry in sys.path:
        if not entry or not _os.path.isabs(entry):  # type: ignore[union-attr]  # os is loaded: no -S
            continue
        norm = _os.path.normpath(entry)  # type: ignore[union-attr]  # as above
        if norm == cwd or norm == script_dir:
            continue
        kept.append(entry)
    sys.path[:] = kept


_scrub_sys_path()

import errno  # noqa: E402 - imported only after the search path is scrubbed above
import importlib  # noqa: E402  (must follow the sys.path scrub)
import importlib.machinery  # noqa: E402 - imported only after the search path is scrubbed above
import importlib.util  # noqa: E402 - imported only after the search path is scrubbed above
import json  # noqa: E402 - imported only after the search path is scrubbed above
import os  # noqa: E402 - imported only after the search path is scrubbed above
import select  # noqa: E402 - imported only after the search path is scrubbed above
import signal  # noqa: E402 - imported only after the search path is scrubbed above
import threading  # noqa: E402 - imported only after the search path is scrubbed above
import time  # noqa: E402 - imported only after the search path is scrubbed above
import traceback  # noqa: E402 - imported only after the search path is scrubbed above

# Annotations are strings where Python 3.8 could not evaluate them; the names they use are
# read by mypy only (it takes ``TYPE_CHECKING`` as true), so nothing more is imported.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from io import FileIO
    from types import ModuleType
    from typing import Any

ALLOWED_MODULES = ("hooks", "tools", "state", "obsidian", "parsing")
PACKAGE = "icarus"
PACKAGE_DIR_ENV = "CASTOR_ICARUS_DIR"
PARENT_PID_ENV = "CASTOR_WORKER_PARENT"
BEGUN_FD_ENV = "CASTOR_WORKER_BEGUN_FD"


class InvalidRequest(Exception):
    """A request line that cannot be dispatched; carries the id when known."""

    def __init__(self, message: str, request_id: "int | None" = None) -> None:
        Exception.__init__(self, message)
        self.request_id = request_id


# --------------------------------------------------------------------------- streams

def _isolate_stdio() -> "tuple[FileIO, FileIO]":
    """Return (protocol_in, protocol_out) binary files; leave fds 0/1 harmless."""
    proto_out_fd = os.dup(1)
    proto_in_fd = os.dup(0)
    os.dup2(2, 1)  # native writes to fd 1 now reach stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull, "r")
    return os.fdopen(proto_in_fd, "rb", buffering=0), os.fdopen(proto_out_fd, "wb", buffering=0)


# --------------------------------------------------------------------------- package

class MissingFunction(AttributeError):
    """The module has no callable of that name: nothing ran (the module itself imported)."""


class OutsidePackage(ImportError):
    """A module of the package whose real file is outside the configured directory: refused
    before any of its code runs."""

    def __init__(self, message: str, module: str) -> None:
        ImportError.__init__(self, message)
        self.module = module


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


_ROOT: "list[str | ImportError]" = []  # [root] or [ImportError]: the configured directory, resolved once


def _package_dir() -> str:
    if not _ROOT:
        raw = os.environ.get(PACKAGE_DIR_ENV, "")
        if not raw or not os.path.isabs(raw):
            _ROOT.append(ImportError("%s must name the configured icarus directory by absolute path"
                                     % PACKAGE_DIR_ENV))
        else:
            _ROOT.append(os.path.realpath(raw))
    if isinstance(_ROOT[0], BaseException):
        raise _ROOT[0]
    return _ROOT[0]


def _check_spec(spec: "ModuleSpec", root: str) -> "ModuleSpec":
    """Refuse a spec whose code (its file, its bytecode cache, its search path) resolves outside
    ``root``. Runs before the module's code does."""
    places: "list[str]" = []
    if spec.origin is not None and getattr(spec, "has_location", False):
        places.append(spec.origin)
        cached = getattr(spec, "cached", None)
        if cached and getattr(sys, "pycache_prefix", None) is None:
            places.append(cached)  # a __pycache__ that is a symlink out would feed outside bytecode
    elif spec.submodule_search_locations is None:
        places.append(spec.origin or "")  # a builtin/frozen "icarus.x" is not the package's
    places.extend(spec.submodule_search_locations or ())
    for place in places:
        if not place or not _inside(place, root):
            raise OutsidePackage("%s resolves outside the configured icarus directory; refused before import"
                                 % spec.name, spec.name)
    return spec


class _PackageFinder(object):
    """First on ``sys.meta_path``: every module of the package is found under the configured
    directory only, and its real location is checked before its code runs."""

    def find_spec(self, fullname: str, path: "Sequence[str] | None" = None,
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        root = _package_dir()
        if fullname == PACKAGE:
            init = os.path.join(root, "__init__.py")
            if not os.path.isfile(init):
                raise ImportError("no icarus package at %s" % root)
            spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[root])
            assert spec is not None  # a .py file always has a loader
        else:
            parent = sys.modules.get(fullname.rpartition(".")[0])
            search = getattr(parent, "__path__", None)
            spec = importlib.machinery.PathFinder.find_spec(fullname, list(search)) if search is not None else None
            if spec is None:
                raise ModuleNotFoundError("No module named %r" % fullname, name=fullname)
        return _check_spec(spec, root)

    def invalidate_caches(self) -> None:
        pass


_FINDER = _PackageFinder()
_PACKAGE_MODULE: "list[ModuleType]" = []  # [the loaded package module]
_MODULES: "dict[str, ModuleType]" = {}  # full name -> the module object checked when it was first resolved


def _load_package() -> str:
    """Load (once) the configured ``icarus`` package by path."""
    root = _package_dir()
    current = sys.modules.get(PACKAGE)
    if current is not None and _PACKAGE_MODULE and current is _PACKAGE_MODULE[0]:
        return root
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    _MODULES.clear()
    del _PACKAGE_MODULE[:]
    spec = _FINDER.find_spec(PACKAGE)
    assert spec is not None and spec.loader is not None  # the package's own spec: find_spec raises otherwise
    module = importlib.util.module_from_spec(spec)
    module.__castor_root__ = root  # type: ignore[attr-defined]  # a marker on the module, no declared field
    sys.modules[PACKAGE] = module
    _note_database_opens()  # before the backend's first line: which database it opens is seen
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(PACKAGE, None)
        raise
    if not _inside(module.__file__ or "", root):  # its file was checked: None is refused too
        raise ImportError("icarus resolved outside the configured directory")
    _PACKAGE_MODULE.append(module)
    return root


def _target(module_name: str, function_name: str) -> "Callable[..., Any]":
    full = PACKAGE + "." + module_name
    module = sys.modules.get(full)
    package = _PACKAGE_MODULE[0] if _PACKAGE_MODULE else None
    if module is None or _MODULES.get(full) is not module or package is None or sys.modules.get(PACKAGE) is not package:
        module = _resolve(full)
    fn: "Callable[..., Any] | None" = getattr(module, function_name, None)
    if fn is None or not callable(fn):
        raise MissingFunction("icarus.%s has no callable %r" % (module_name, function_name))
    return fn


def _resolve(full: str) -> "ModuleType":
    """The slow path of :func:`_target`: import and check once per module object."""
    root = _load_package()
    module = importlib.import_module(full)
    if not _inside(getattr(module, "__file__", "") or "", root):
        raise ImportError("%s resolved outside the configured directory" % full)
    _MODULES[full] = module
    return module


# --------------------------------------------------------------------------- protocol

_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by __init__; typeshed omits it
# (json.loads without its per-call wrapper)


def _parse(line: str) -> "tuple[int, str, str, list[Any], dict[str, Any]]":
    try:
        request, end = _SCAN(line, 0)  # the line is stripped: one value must fill it
    except (ValueError, StopIteration, RecursionError):
        raise InvalidRequest("invalid request: not JSON") from None
    if end != len(line):
        raise InvalidRequest("invalid request: not JSON")
    if not isinstance(request, dict):
        raise InvalidRequest("invalid request: not an object")
    request_id = request.get("id")
    if type(request_id) is not int and (isinstance(request_id, bool) or not isinstance(request_id, int)):
        raise InvalidRequest("invalid request: id must be an integer")
    module = request.get("module")
    function = request.get("function")
    if module not in ALLOWED_MODULES:
        raise InvalidRequest("invalid request: module must be one of %s" % ", ".join(ALLOWED_MODULES), request_id)
    if not isinstance(function, str) or not function.isidentifier() or function.startswith("__"):
        raise InvalidRequest("invalid request: function must be a public identifier", request_id)
    args = request.get("args")
    kwargs = request.get("kwargs")
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise InvalidRequest("invalid request: args must be a list and kwargs an object", request_id)
    return request_id, module, function, args, kwargs


def normalise(value: "Any", *, as_text: bool = False) -> "Any":
    """JSON-looking strings become structures when they parse.

    ``as_text`` (the request loop's own call): a JSON text that can go on the reply line as it
    is -- ASCII, one line, no NaN or infinity -- is returned as :class:`_JsonText` instead of
    its structure, checked by the same parse but not encoded again (the parent parses the line
    to the same values as the re-encoded structure). Anything else takes the general path.
    """
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "["):
            if as_text and stripped.isascii() and stripped.find("\n") < 0 and stripped.find("\r") < 0:
                try:  # json.loads without its wrappers: stripped, one value must fill the text
                    _value, end = _CHECKING_SCAN(stripped, 0)
                except _NotFinite:
                    pass  # parsed below: it fails to encode ("unserializable result") as ever
                except (ValueError, StopIteration, RecursionError):
                    return value
                else:
                    return _JsonText(stripped) if end == len(stripped) else value
            try:
                return json.loads(stripped)
            except (ValueError, RecursionError):  # too deeply nested to parse is "does not parse"
                return value
    return value


class _JsonText:
    """A result's JSON text, checked, that goes on the reply line as it is (:func:`normalise`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _NotFinite(Exception):
    """A NaN or an infinity in a JSON text: JSON cannot carry it, so the text is not sent as is."""


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf is NaN (and NaN compares unequal to everything)
        raise _NotFinite(text)
    return value


def _no_constant(name: str) -> "Any":
    raise _NotFinite(name)


#: json.loads's parse, but a float that overflows or a NaN / Infinity literal stops it: the
#: encoder refuses those (``allow_nan=False``), so such a text goes the general way.
_CHECKING_SCAN = json.JSONDecoder(  # type: ignore[attr-defined]  # scan_once: set by __init__; typeshed omits it
    parse_float=_finite_float, parse_constant=_no_constant).scan_once


_ENCODER = json.JSONEncoder(ensure_ascii=True, default=str, allow_nan=False)
# The C encoder JSONEncoder.encode builds per call, built once (without a markers dict a cycle
# ends in RecursionError, which is "unserializable result" like any other).
try:
    _C_ENCODER = json.encoder.c_make_encoder(  # type: ignore[attr-defined]  # CPython-private, not in typeshed
        None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, False)
except (AttributeError, TypeError):  # no C accelerator (or another signature): the plain encoder
    _C_ENCODER = None


#: A successful reply as the C encoder writes ``handle``'s dict (its keys in this order, its
#: separators) around the result's own JSON: formatted, the head costs no encoding (castor's
#: parser finds a reply by this head). The id is an int (``_parse`` refuses any other).
_OK_REPLY = '{"id": %d, "ok": true, "result": %s}\n'


def _encode(reply: "dict[str, Any]") -> bytes:
    # ASCII JSON: a lone surrogate in backend text (a "\\ud800" it decoded) becomes an escape
    # instead of failing the UTF-8 encoding; castor replaces it when it reads the reply.
    try:
        if reply["ok"] is True and type(reply["result"]) is _JsonText:
            # checked JSON text, ASCII and one line (normalise): not encoded again
            return (_OK_REPLY % (reply["id"], reply["result"].text)).encode("ascii")
        if _C_ENCODER is None:
            text = _ENCODER.encode(reply)
        elif reply["ok"] is True:  # handle's answer {id, ok, result}: only the result is encoded
            return (_OK_REPLY % (reply["id"], "".join(_C_ENCODER(reply["result"], 0)))).encode("ascii")
        else:
            text = "".join(_C_ENCODER(reply, 0))
    except Exception:  # noqa: BLE001 - NaN, a cycle, a value whose __str__ raises: the worker lives on
        text = json.dumps(
            {"id": reply.get("id"), "ok": False, "error": "unserializable result", "traceback": ""},
            ensure_ascii=True,
        )
    return (text + "\n").encode("ascii")


def handle(line: str, *, text_results: bool = False) -> "dict[str, Any]":
    """One request line -> one reply dict. Never raises (except KeyboardInterrupt).

    ``text_results`` (the request loop, which encodes the reply with :func:`_encode`): a result
    that is sendable JSON text stays text (:func:`normalise`'s ``as_text``)."""
    try:
        request_id, module, function, args, kwargs = _parse(line)
    except InvalidRequest as exc:
        return {"id": exc.request_id, "ok": False, "error": str(exc), "traceback": ""}
    try:
        result = _target(module, function)(*args, **kwargs)
        return {"id": request_id, "ok": True, "result": normalise(result, as_text=text_results)}
    except KeyboardInterrupt:
        raise
    except OutsidePackage as exc:
        return {"id": request_id, "ok": False, "error": str(exc), "traceback": "",
                "refused": "outside_package", "module": exc.module}
    except MissingFunction as exc:
        return {"id": request_id, "ok": False, "error": str(exc), "traceback": "", "refused": "missing_function"}
    except BaseException as exc:  # SystemExit too: the worker outlives one bad call
        reply = {"id": request_id, "ok": False, "error": _text_of(exc), "traceback": _traceback_text()}
        unusable = _fabric_dir_fault(exc)
        if unusable is not None:  # the setting's path is what failed: named, not the backend's text
            name, setting, path, why = unusable
            reply["storage"], reply["unusable"] = name, {"setting": setting, "path": path, "why": why}
            return reply
        storage = _storage_errno(exc)
        if storage is not None:
            reply["storage"] = storage
        return reply


#: What the storage refuses (castor's own list, castor.adapters.fs.STORAGE_ERRNOS; a test pins the two).
STORAGE_ERRNOS = ("ENOSPC", "EDQUOT", "EIO", "EROFS", "EACCES", "EPERM", "EFBIG", "EMLINK", "ENAMETOOLONG",
                  "EMFILE", "ENFILE")
#: SQLite's result codes for the same faults (its exceptions carry no errno): FULL, READONLY, IOERR.
_SQLITE_CODES = {13: "ENOSPC", 8: "EROFS", 10: "EIO"}
_SQLITE_TEXTS = (("database or disk is full", "ENOSPC"), ("readonly database", "EROFS"), ("disk I/O error", "EIO"))


def _storage_errno(exc: "BaseException | None") -> "str | None":
    """The errno name when the backend failed because the storage refused it -- an ``OSError`` of
    :data:`STORAGE_ERRNOS`, or SQLite's "database or disk is full" and the like -- here or in the
    exceptions it was raised from; None otherwise. Never raises."""
    try:
        for _ in range(8):  # the exception and what it was raised from, a few deep
            if exc is None:
                return None
            if isinstance(exc, OSError):
                name = errno.errorcode.get(exc.errno or -1)
                if name in STORAGE_ERRNOS:
                    return name
            elif type(exc).__module__ == "sqlite3":
                code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
                if isinstance(code, int) and code & 0xFF in _SQLITE_CODES:
                    return _SQLITE_CODES[code & 0xFF]
                text = str(exc)
                for fragment, name in _SQLITE_TEXTS:
                    if fragment in text:
                        return name
            exc = exc.__cause__ or exc.__context__
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises: no classification, the reply stands
        return None
    return None


#: The SQLite result code a database file it cannot open fails with (SQLITE_CANTOPEN).
_SQLITE_CANTOPEN = 14


def _fabric_dir() -> str:
    """The ``fabricDir`` setting as castor passed it to the backend (``FABRIC_DIR``), absolute."""
    raw = os.environ.get("FABRIC_DIR") or ""
    return os.path.abspath(raw) if raw else ""


#: The endings of a database file's name: a directory so named inside ``fabricDir`` is taken for
#: the backend's database file, made a directory, when SQLite cannot open its database there.
_DATABASE_ENDINGS = (".db", ".db3", ".sqlite", ".sqlite3")
#: The database files the backend asked SQLite to open (``sqlite3.connect``'s first argument,
#: absolute), the newest last, at most :data:`_OPENED_DATABASES_MAX` of them: a directory among
#: them, whatever its name ends with, is the one in the way when SQLite cannot open its database.
_OPENED_DATABASES: "list[str]" = []
_OPENED_DATABASES_MAX = 16


def _note_database_opens() -> None:
    """From now on, note each database file the backend asks ``sqlite3.connect`` to open (in
    :data:`_OPENED_DATABASES`), before it is opened; the connection is the one SQLite makes, as
    before. Done once, before the backend's code first runs (so ``from sqlite3 import connect`` in
    it takes the noting one too); without a ``sqlite3`` module, nothing."""
    try:
        import sqlite3
        import sqlite3.dbapi2
    except ImportError:
        return
    connect = sqlite3.connect
    if getattr(connect, "__castor_notes_databases__", False):
        return

    def noting_connect(database: "Any", *args: "Any", **kwargs: "Any") -> "Any":
        try:
            name = os.fsdecode(database)
            if name and not name.startswith((":", "file:")):  # ":memory:", a URI: no file named
                path = os.path.abspath(name)
                if path in _OPENED_DATABASES:
                    _OPENED_DATABASES.remove(path)
                _OPENED_DATABASES.append(path)
                del _OPENED_DATABASES[:-_OPENED_DATABASES_MAX]
        except Exception:  # noqa: BLE001 - noting must never change what the backend's call does
            pass
        return connect(database, *args, **kwargs)

    noting_connect.__castor_notes_databases__ = True  # type: ignore[attr-defined]  # a marker, no declared field
    noting_connect.__doc__ = connect.__doc__
    noting_connect.__name__ = connect.__name__
    sqlite3.connect = sqlite3.dbapi2.connect = noting_connect
#: How many entries of ``fabricDir`` are looked at for such a directory (a bound on the work).
_DATABASE_SCAN_MAX = 512


def _fabric_dir_fault(exc: "BaseException | None") -> "tuple[str, str, str, str] | None":
    """``(errno name, setting, path, why)`` when the backend failed because a path castor gave it
    cannot be used -- ``fabricDir`` a dangling symlink, a file, a directory nothing can be created
    in, or holding a directory where the backend's database file should be; ``stateDbPath`` a
    directory -- seen from an ``OSError`` on that path (or in it), or SQLite's "unable to open
    database file"; None otherwise. Never raises; what it says is castor's own words, never the
    backend's text (an entry's name is the configuration's, not memory)."""
    fabric = _fabric_dir()
    if not fabric:
        return None
    try:
        suspect = False
        inside: "list[str]" = []  # paths in fabricDir an OSError named
        for _ in range(8):  # the exception and what it was raised from, a few deep
            if exc is None:
                break
            if isinstance(exc, OSError):
                for name in (exc.filename, exc.filename2):
                    if isinstance(name, str) and name and (
                            os.path.abspath(name) == fabric or os.path.abspath(name).startswith(fabric + os.sep)):
                        suspect = True
                        inside.append(os.path.abspath(name))
            elif type(exc).__module__ == "sqlite3":
                code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
                suspect = suspect or (isinstance(code, int) and code & 0xFF == _SQLITE_CANTOPEN) \
                    or "unable to open database file" in str(exc)
            exc = exc.__cause__ or exc.__context__
        if not suspect:
            return None
        found = _unusable_dir(fabric)
        if found is not None:
            return found[0], "fabricDir", fabric, found[1]
        return _directory_in_the_way(fabric, inside)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises: no classification, the reply stands
        return None


def _directory_in_the_way(fabric: str, named: "list[str]") -> "tuple[str, str, str, str] | None":
    """A directory where the backend wanted a file: ``stateDbPath`` itself, a path in ``fabricDir``
    an ``OSError`` named, or (SQLite names no path) a database file in ``fabricDir`` the backend
    asked SQLite to open (:data:`_OPENED_DATABASES`, whatever its name) or an entry named like one;
    as ``_fabric_dir_fault`` returns it, or None."""
    state_db = os.environ.get("STATE_DB_PATH") or ""
    if state_db and os.path.isdir(state_db):
        return "EISDIR", "stateDbPath", os.path.abspath(state_db), "is a directory, not a database file"
    candidates = [path for path in named if path != fabric]
    if not candidates:
        candidates = [path for path in reversed(_OPENED_DATABASES) if path.startswith(fabric + os.sep)]
        with os.scandir(fabric) as entries:
            for seen, entry in enumerate(entries):
                if seen >= _DATABASE_SCAN_MAX:
                    break
                if entry.name.lower().endswith(_DATABASE_ENDINGS):
                    candidates.append(entry.path)
    for path in candidates:
        if os.path.isdir(path):
            return ("EISDIR", "fabricDir", fabric,
                    "holds a directory where a file should be (%s)" % os.path.relpath(path, fabric))
    return None


def _unusable_dir(path: str) -> "tuple[str, str] | None":
    """Why ``path`` cannot hold a backend's files (errno name, words), or None if it can."""
    if os.path.islink(path) and not os.path.exists(path):
        return "ENOENT", "is a symlink to nothing (dangling)"
    if os.path.exists(path) and not os.path.isdir(path):
        return "ENOTDIR", "is not a directory"
    if not os.path.exists(path):
        return None  # the backend may create it: not this fault
    probe = os.path.join(path, ".castor-fabric-probe-%d" % os.getpid())
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    except OSError as exc:
        return errno.errorcode.get(exc.errno or -1, "EIO"), "is a directory no file can be created in"
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return None


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or its type's name when that is empty or raises (a backend's own exception)."""
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises must not end the worker
        return type(exc).__name__


def _traceback_text() -> str:
    try:
        return traceback.format_exc()
    except Exception:  # noqa: BLE001 - formatting calls the exception's __str__ too
        return ""


def _write_all(stream: "FileIO", data: "bytes | memoryview") -> None:
    view = memoryview(data)
    while view:
        written = stream.write(view)
        view = view[written:]


READY_LINE = b'{"ready": "castor-icarus-worker"}\n'
PARENT_CHECK_S = 0.1  # once the pipe has hung up: how often the parent's presence is checked


def _wait_for_hang_up(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, 0)  # no event asked for: only a hang-up (or an error) wakes it, never data
    while not poller.poll():
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, another user's (EPERM)
        return True
    return True


def _named_parent() -> "int | None":
    """The castor that started this worker, as it named itself (``CASTOR_WORKER_PARENT``)."""
    named = os.environ.get(PARENT_PID_ENV, "")
    return int(named) if named.isascii() and named.isdigit() else None


def _end_with_the_parent(fd: int, parent: int, named: "int | None") -> None:
    """Wait for the request pipe's hang-up; then, once ``parent`` is no longer this process's
    parent or the castor that named itself is gone (it may have died before this process ran at
    all: then ``parent`` is already the reaper), end the group (see the module's guarantees)."""
    _wait_for_hang_up(fd)
    # it closed the pipe and lives: the calls left run to their end
    while os.getppid() == parent and (named is None or _alive(named)):
        time.sleep(PARENT_CHECK_S)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _begun_counter() -> "Any":
    """The page castor shares to learn how many requests this worker began (``BEGUN_FD_ENV``), as
    one unsigned 64-bit slot; None when castor gave none. Its descriptor is closed (the mapping
    stays) and its variable removed, so backend code inherits neither."""
    named = os.environ.pop(BEGUN_FD_ENV, "")
    if not (named.isascii() and named.isdigit()):
        return None
    fd = int(named)
    try:
        import mmap
        return memoryview(mmap.mmap(fd, 8)).cast("Q")
    except (OSError, ValueError, TypeError):
        return None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def main() -> int:
    begun = _begun_counter()
    count = 0
    proto_in, proto_out = _isolate_stdio()
    threading.Thread(target=_end_with_the_parent, args=(proto_in.fileno(), os.getppid(), _named_parent()),
                     name="parent-watch", daemon=True).start()
    _write_all(proto_out, READY_LINE)
    write = proto_out.write
    buffered = b""
    tail = []  # chunks of a request line still without its newline: joined once, when it comes
    while True:
        chunk = proto_in.read(65536)
        if not chunk:
            return 0
        if chunk.find(b"\n") < 0:  # ``buffered += chunk`` per chunk was quadratic in a line's size
            tail.append(chunk)
            continue
        if tail:
            tail.append(chunk)
            chunk = b"".join(tail)
            tail = []
        buffered += chunk
        # find, not ``in``: ``b"\n" in data`` first tries the needle as an integer (a byte value)
        # and builds and drops a TypeError for it, about 2k instructions every time.
        while buffered.find(b"\n") >= 0:
            # partition, not split: bytes.split scans byte by byte (~3 us for a 10 KiB line),
            # partition finds the newline with memchr.
            raw, _newline, buffered = buffered.partition(b"\n")
            line = raw.strip()
            if not line:
                continue
            count += 1
            if begun is not None:
                begun[0] = count  # a store, no syscall: castor reads it only after a death
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                reply = {"id": None, "ok": False, "error": "invalid request: not UTF-8", "traceback": ""}
            else:
                reply = handle(text, text_results=True)
            data = _encode(reply)
            written = write(data)  # the whole line, as a rule (a blocking pipe)
            if written != len(data):
                _write_all(proto_out, memoryview(data)[written or 0:])


if __name__ == "__main__":
    sys.exit(main())
