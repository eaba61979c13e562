"""The built-in utilities a utility socket can name, run by the runtime's utility pool.

Which source a utility socket's output comes from (its ``command``, its
``params.output``, a built-in, else an "Unknown utility alias" error) is the
engine's decision (:mod:`castor.domain.materia.engine`); commands run in the
runtime's pool (:mod:`castor.actors.materia.utility_pool`); this module runs the
built-ins that need IO.

Built-ins: ``noop`` (""), ``echo`` (``params.output`` else ``text`` else
``message`` else ""; non-strings as JSON), ``project.ensureIgnored`` and
``vcs.detect`` (see their docstrings).

Guarantees and failure behaviour
--------------------------------
- Bad built-in params and unknown aliases raise :class:`UtilityError`
  (code ``invalid_config``, ``data.reason``); nothing is written.
- ``project.ensureIgnored`` never writes outside the project, and never through a link: the
  root is ``params.root`` (inside the project), else the nearest enclosing VCS root whose marker
  (``.jj``/``.git``) and directory belong to castor's user (or root) -- another user's ``/tmp/.git``
  is not a root -- else the project. ``params.file`` must resolve inside that root and name an
  ignore file (its name ends in ``ignore``; no ``.git``/``.jj`` component): appending lines to
  any other file is how a config would plant code (``~/.bashrc`` under a home directory that is a
  dotfiles repository, ``.git/config``'s ``fsmonitor``, ``.envrc``). The target
  must not be a symlink, and an existing one must be a regular file: it is read without
  following links and replaced atomically with its own permission bits (``Forbidden``
  otherwise, nothing read or written). This is stricter than pi-materia, which followed any
  path and any link.
- ``vcs.detect`` runs only ``jj``/``git`` found on ``PATH`` (never a
  project-chosen binary), each with a 2 s deadline and a 1 MiB cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from castor.adapters.executables import which_outside
from castor.adapters.fs import atomic_write_text, make_dirs
from castor.adapters.materia.process_runner import UtilityCommand, UtilitySpawnError, run_command
from castor.domain.jsontext import js_stringify
from castor.domain.materia.engine import echo_output
from castor.messages.errors import CastorError, ErrorCode, Forbidden

__all__ = [
    "BUILTIN_ALIASES",
    "UtilityError",
    "ensure_ignored",
    "run_builtin",
    "vcs_detect",
]

BUILTIN_ALIASES = ("noop", "echo", "project.ensureIgnored", "vcs.detect")
_VCS_TIMEOUT_MS = 2_000


class UtilityError(CastorError):
    """A utility socket that cannot produce output (bad alias or params)."""

    code = ErrorCode.INVALID_CONFIG


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else js_stringify(value)


# --------------------------------------------------------------------------- vcs


def _marker_root(start: Path, marker: str) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / marker).exists():
            return directory
    return None


def _owned_marker_root(start: Path, marker: str) -> Path | None:
    """The nearest enclosing directory holding ``marker`` that castor's user (or root) owns, as
    the marker itself: one another user planted (``/tmp/.git``) names no root of ours."""
    me = os.geteuid()
    for directory in (start, *start.parents):
        try:
            marker_st = os.lstat(directory / marker)
            dir_st = os.lstat(directory)
        except OSError:
            continue
        if marker_st.st_uid in (me, 0) and dir_st.st_uid in (me, 0):
            return directory
    return None


def _command_root(argv: list[str], cwd: Path) -> Path | None:
    try:
        result = run_command(UtilityCommand(argv=argv, cwd=cwd, timeout_ms=_VCS_TIMEOUT_MS))
    except UtilitySpawnError:
        return None
    text = result.stdout.strip()
    return Path(text) if result.ok and text else None


def vcs_detect(cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """``{kind: jj|git|none, root, available:{jj,git}}``."""
    base = Path(cwd).resolve()
    path_var = os.environ.get("PATH")
    available = {name: which_outside(name, path_var, str(base)) is not None for name in ("jj", "git")}
    roots: dict[str, Path | None] = {}
    for name, marker, argv in (("jj", ".jj", ["jj", "root"]), ("git", ".git", ["git", "rev-parse", "--show-toplevel"])):
        root = _marker_root(base, marker)
        if root is None and available[name]:
            root = _command_root(argv, base)
        roots[name] = root
    kind = "jj" if roots["jj"] else "git" if roots["git"] else "none"
    root = roots.get(kind) if kind != "none" else None
    return {"kind": kind, "root": str(root) if root else None, "available": available}


# --------------------------------------------------------------------------- ensureIgnored


def _patterns(params: dict[str, Any]) -> list[str]:
    raw = params.get("patterns")
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p.strip() for p in raw):
        raise UtilityError(
            "project.ensureIgnored requires params.patterns: a non-empty array of non-blank strings",
            data={"reason": "invalid_params"},
        )
    return [p.strip() for p in raw]


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _check_ignore_file(relative: Path) -> None:
    """``params.file`` names an ignore file (``.gitignore``, ``.ignore``, ``web/.dockerignore``...)
    outside the VCS's own directories. Appending lines to any other file is how a config would
    plant code: ``~/.bashrc`` under a home directory that is a repository, ``.git/config``'s
    ``fsmonitor``, a hook, ``.envrc``."""
    if not relative.name.endswith("ignore") or any(part in (".git", ".jj") for part in relative.parts):
        raise Forbidden(f"params.file must name an ignore file (a name ending in 'ignore', outside .git and "
                        f".jj), not {str(relative)!r}", data={"reason": "not_an_ignore_file"})


def _read_plain_file(target: Path) -> str | None:
    """The text of ``target`` (None if missing), read without following a link; ``Forbidden``
    for a symlink or anything but a regular file (its content is never read)."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # O_NOFOLLOW on a link is ELOOP; a dangling link is ENOENT, and writing would create its target
        if os.path.islink(target):
            raise Forbidden(f"{target.name} is a symlink; castor does not write through it",
                            data={"reason": "symlink"}) from None
        if isinstance(exc, FileNotFoundError):
            return None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise Forbidden(f"{target.name} is not a regular file", data={"reason": "not_a_file"})
        return handle.read().decode("utf-8")


def _ignore_root(params: dict[str, Any], cwd: Path) -> Path:
    vcs_root = _owned_marker_root(cwd, ".jj") or _owned_marker_root(cwd, ".git")
    if "root" not in params or params["root"] is None:
        return vcs_root or cwd
    if not isinstance(params["root"], str) or "\x00" in params["root"]:
        raise UtilityError("params.root must be a string", data={"reason": "invalid_params"})
    root = (cwd / params["root"]).resolve()
    if not (_inside(root, cwd) or root == vcs_root):
        raise Forbidden("params.root leaves the project", data={"reason": "root outside project"})
    return root


def ensure_ignored(params: dict[str, Any], cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """Append missing patterns to an ignore file, idempotently."""
    base = Path(cwd).resolve()
    patterns = _patterns(params)
    root = _ignore_root(params, base)
    file_param = params.get("file")
    if file_param is not None and (not isinstance(file_param, str) or "\x00" in file_param):
        raise UtilityError("params.file must be a string", data={"reason": "invalid_params"})
    if file_param:
        target = (root / file_param).resolve()
        if not _inside(target, root):
            raise Forbidden("params.file leaves the project", data={"reason": "file outside root"})
        _check_ignore_file(target.relative_to(root))
    else:
        target = root / ".gitignore"
    existing_text = _read_plain_file(target)
    existing = {
        line.strip() for line in (existing_text or "").splitlines() if line.strip() and not line.strip().startswith("#")
    }
    added: list[str] = []
    unchanged: list[str] = []
    for pattern in patterns:
        if pattern in existing:
            if pattern not in unchanged:
                unchanged.append(pattern)
        elif pattern not in added:
            added.append(pattern)
    if added or existing_text is None:
        text = existing_text or ""
        prefix = "" if not text or text.endswith("\n") else "\n"
        addition = "".join(f"{p}\n" for p in added)
        make_dirs(target.parent)
        if not _inside(target.parent.resolve(), root):  # a link among the new file's directories
            raise Forbidden("params.file leaves the project", data={"reason": "file outside root"})
        atomic_write_text(target, text + prefix + addition, keep_mode=True)
    return {
        "ok": True,
        "root": str(root),
        "file": str(target),
        "patterns": patterns,
        "added": added,
        "unchanged": unchanged,
    }


# --------------------------------------------------------------------------- dispatch




def run_builtin(alias: str, params: dict[str, Any] | None, *, cwd: str | os.PathLike[str]) -> str:
    """Run a built-in utility by alias and return its output text."""
    params = params or {}
    if alias == "noop":
        return ""
    if alias == "echo":
        return echo_output(params)
    if alias == "project.ensureIgnored":
        return _as_text(ensure_ignored(params, cwd))
    if alias == "vcs.detect":
        return _as_text(vcs_detect(cwd))
    raise UtilityError(f'Unknown utility alias "{alias}".', data={"reason": "unknown_alias", "alias": alias})
