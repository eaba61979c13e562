"""Finding a program by its bare name without letting a project choose it.

A bare name (``git``, ``make``, ``python3``) is looked up in ``PATH``. An entry that is empty,
relative (``.``, ``bin``) or inside the project -- as written or once symlinks are followed --
would let a project's own file of that name run (``subprocess`` resolves a relative entry in the
child, after it has changed into the project). So only absolute entries outside the project are
searched; a name found nowhere else is not found.
"""

from __future__ import annotations

import os
import posixpath
import shutil


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or under it, as written or once links are followed (a ``PATH`` or
    ``PYTHONPATH`` entry that reaches the project through a symlink is the project too, and so
    is any entry when the project itself is reached through one)."""
    return _under(posixpath.normpath(path), posixpath.normpath(root)) or _under(
        os.path.realpath(path), os.path.realpath(root))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def safe_path_entries(path_var: str | None, project: str) -> list[str]:
    """The entries of ``path_var`` a lookup may use: absolute, outside ``project``."""
    return [d for d in (path_var or "").split(os.pathsep) if d and posixpath.isabs(d) and not inside(d, project)]


def which_outside(name: str, path_var: str | None, project: str) -> str | None:
    """The program ``name`` (a bare name) from the safe entries of ``path_var``, else None."""
    safe = safe_path_entries(path_var, project)
    return shutil.which(name, path=os.pathsep.join(safe)) if safe else None
