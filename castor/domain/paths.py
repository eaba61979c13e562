"""The one confinement rule for a path that comes from a client or a project file.

A user path is taken relative to the root it belongs to (the project directory, an
artifact root, a cast's run directory) and must stay inside it:

| the value                                   | answer                                  |
|---------------------------------------------|-----------------------------------------|
| not text, empty, or with a NUL byte         | refused                                 |
| a ``..`` component anywhere                 | refused (even ``a/../b``: no walking up) |
| absolute                                    | refused, unless the caller allows an absolute path that lies inside the root |
| relative, none of the above                 | ``root/value``, normalised (``.`` and ``//`` dropped) |
| ... whose real location (symlinks resolved) is outside the root | refused — checked by the adapter (:func:`castor.adapters.fs.confine`), which is the only part that looks at the disk |

This module is pure: it never touches the disk, so it can say *why* before anything is
opened, stat-ed or created. Every refusal is one of the ``REASON_*`` strings below (they
appear as ``data.reason`` of the ``forbidden`` error the adapters raise).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from castor.messages.errors import Forbidden, InvalidParams, StorageUnavailable

REASON_NOT_TEXT = "non-text path part"
REASON_NUL = "NUL byte in path"
REASON_EMPTY = "empty path part"
REASON_ABSOLUTE = "absolute path part"
REASON_PARENT = "parent-directory component"
REASON_OUTSIDE = "absolute path outside root"
REASON_SYMLINK = "path escapes root (symlink)"

CONFINEMENT_REASONS = frozenset({REASON_NOT_TEXT, REASON_NUL, REASON_EMPTY, REASON_ABSOLUTE, REASON_PARENT,
                                 REASON_OUTSIDE, REASON_SYMLINK})


def refusal(value: object, *, allow_absolute: bool = False) -> str | None:
    """Why ``value`` may not name a path under a root (a ``REASON_*``), or ``None``.

    With ``allow_absolute`` an absolute value passes here; :func:`lexical_target` then
    checks that it lies inside the root."""
    if not isinstance(value, str):
        return REASON_NOT_TEXT
    if "\x00" in value:
        return REASON_NUL
    if value == "":
        return REASON_EMPTY
    if value.startswith("/") and not allow_absolute:  # os.path.isabs on POSIX
        return REASON_ABSOLUTE
    if ".." in value.split("/"):
        return REASON_PARENT
    return None


def inside(root: str, path: str) -> bool:
    """``path`` is ``root`` or below it (both absolute and normalised; no disk access)."""
    if path == root:
        return True
    prefix = root if root.endswith("/") else root + "/"
    return path.startswith(prefix)


def lexical_target(root: str, value: object, *, allow_absolute: bool = False) -> tuple[str | None, str | None]:
    """``(absolute normalised path, None)`` for an acceptable ``value`` under ``root`` (an
    absolute, normalised path), else ``(None, reason)``. Symlinks are the adapter's part."""
    reason = refusal(value, allow_absolute=allow_absolute)
    if reason is not None:
        return None, reason
    assert isinstance(value, str)
    target = posixpath.normpath(value if value.startswith("/") else posixpath.join(root, value))
    if target.startswith("//"):  # normpath keeps a leading double slash
        target = "/" + target.lstrip("/")
    if not inside(root, target):
        return None, REASON_OUTSIDE
    return target, None



# ---------------------------------------------------------------------------
# A session's project directory and the artifact directory a project configures

DEFAULT_ARTIFACT_DIR = ".pi/pi-materia"
"""Where a project's casts write when its config names no ``artifactDir`` (relative to the project)."""


def check_project_path(cwd: str) -> None:
    """A session's ``cwd`` is its project and must be an absolute path without a NUL byte
    (``invalid_params`` otherwise): a relative one would be taken against the runtime's own
    working directory. That it exists is the adapter's part (it looks at the disk)."""
    if "\x00" in cwd or not posixpath.isabs(cwd):
        raise InvalidParams("cwd must be an absolute path", data={"cwd": cwd[:200].replace("\x00", "\\0")})


def artifact_dir_outside(configured: str | None, project: str, refused: Forbidden,
                         link: tuple[str, str] | None = None) -> Forbidden:
    """The ``forbidden`` error for a configured ``artifactDir`` that would leave the project:
    a hostile config may not make a cast write into ``/etc`` or a sibling checkout. ``link``
    (the project-relative path of a symbolic link the directory leads out through, and where it
    leads) names that link and says to replace it: the value itself is then no fault of its own."""
    reason = refused.data.get("reason")

    def shown(text: str) -> str:
        return text[:200].encode("unicode_escape", "backslashreplace").decode("ascii")

    data = {"artifactDir": str(configured)[:200], "cwd": project, "reason": reason}
    if link is not None:
        return Forbidden(
            f"artifactDir must stay inside the project directory: {shown(str(configured))!r} is refused: "
            f"{shown(link[0])!r} is a symbolic link to {shown(link[1])}, outside the project; make "
            f"{shown(link[0])!r} a directory of the project, or set artifactDir to one",
            data={**data, "link": link[0][:200], "linkTarget": link[1][:200]},
        )
    return Forbidden(
        f"artifactDir must stay inside the project directory: {shown(str(configured))!r} is refused ({reason}); "
        "name a directory below the project without '..', e.g. \".pi/pi-materia\"",
        data=data,
    )


def named_under(error: StorageUnavailable, projects: Iterable[str]) -> StorageUnavailable:
    """``error`` naming its file relative to the first of ``projects`` (the project directory as
    given and as resolved) that holds it, as every storage error shows a file inside the project;
    ``error`` itself when its ``data.path`` is relative already or lies outside them."""
    path = error.data.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        return error
    for project in projects:
        base = project.rstrip("/")
        if base and path.startswith(base + "/"):
            shown = path[len(base) + 1:]
            return StorageUnavailable(error.message.replace(path, shown), data={**error.data, "path": shown})
    return error
