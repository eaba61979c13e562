"""How the Icarus worker subprocess is launched: argv, cwd and environment.

Guarantees
----------
- ``argv`` is ``[<python>, "-u", <worker_program.py>]``. ``<python>`` and the
  package directory come only from :class:`IcarusSettings`, which already
  ignores an untrusted project's layer, so a project can never choose the
  executable or the package before trust. A bare interpreter name is looked
  up only in *absolute* ``PATH`` entries outside the project directory (a
  ``./python3`` in the project is never picked).
- ``-I``/``-E``/``-S`` are deliberately not used: the plugin needs its venv's
  site-packages and the sanitised ``PYTHONPATH``. ``PYTHONSAFEPATH=1`` is set
  (Python >= 3.11 then adds no script/cwd entry) and the worker program scrubs
  ``sys.path`` itself for older interpreters.
- ``PYTHONPATH`` = parent of ``icarusDir``, then the parent's entries in order
  minus empty, relative and project (cwd or below) entries.
- Identity/path variables for the plugin: ``FABRIC_DIR``,
  ``HERMES_AGENT_NAME``, ``FABRIC_PROJECT_ID`` always; ``HERMES_HOME`` and
  ``STATE_DB_PATH`` only when known. ``CASTOR_ICARUS_DIR`` tells the worker
  program which package to load.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from castor.adapters.executables import inside, which_outside
from castor.domain.icarus.settings import IcarusSettings, resolve_spawn_path

WORKER_PROGRAM = str(Path(__file__).with_name("worker_program.py").resolve())
PACKAGE_DIR_ENV = "CASTOR_ICARUS_DIR"
PARENT_PID_ENV = "CASTOR_WORKER_PARENT"  # the pid of the castor that starts the worker (see worker_program)
#: The descriptor of a shared 8-byte page where the worker counts the requests it began (see
#: worker_program and ``WorkerProcess``: a death before the request began is told apart by it).
BEGUN_FD_ENV = "CASTOR_WORKER_BEGUN_FD"


class WorkerLaunch(BaseModel):
    """Everything needed to spawn one worker; built only from trusted settings."""

    model_config = ConfigDict(frozen=True)

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    icarus_dir: str

    @property
    def python(self) -> str:
        return self.argv[0]


def sanitise_pythonpath(icarus_dir: str, inherited: str | None, cwd: str) -> str:
    """Parent of ``icarusDir`` first, then safe inherited entries."""
    entries = [posixpath.dirname(posixpath.normpath(icarus_dir))]
    for entry in (inherited or "").split(os.pathsep):
        if not entry or not posixpath.isabs(entry):
            continue
        if inside(entry, cwd) or entry in entries:
            continue
        entries.append(entry)
    return os.pathsep.join(entries)


def _safe_path_lookup(name: str, path_var: str | None, cwd: str) -> str:
    return which_outside(name, path_var, cwd) or name  # an unresolvable name fails at spawn as a typed error


def build_launch(settings: IcarusSettings, *, cwd: str, parent_env: Mapping[str, str] | None = None,
                 home: str | None = None, program: str = WORKER_PROGRAM) -> WorkerLaunch:
    parent_env = dict(os.environ if parent_env is None else parent_env)
    home = home or os.path.expanduser("~")
    cwd = os.path.abspath(cwd)
    python = resolve_spawn_path(settings.python, cwd, home)
    if "/" not in python:
        python = _safe_path_lookup(python, parent_env.get("PATH"), cwd)
    icarus_dir = posixpath.normpath(settings.icarus_dir)

    env = dict(parent_env)
    env["PYTHONPATH"] = sanitise_pythonpath(icarus_dir, parent_env.get("PYTHONPATH"), cwd)
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    env[PACKAGE_DIR_ENV] = icarus_dir
    env[PARENT_PID_ENV] = str(os.getpid())
    env["FABRIC_DIR"] = settings.fabric_dir
    env["HERMES_AGENT_NAME"] = settings.agent
    env["FABRIC_PROJECT_ID"] = settings.project_id
    if settings.hermes_home:
        env["HERMES_HOME"] = settings.hermes_home
    else:
        env.pop("HERMES_HOME", None)
    if settings.state_db_path:
        env["STATE_DB_PATH"] = resolve_spawn_path(settings.state_db_path, cwd, home)
    return WorkerLaunch(argv=(python, "-u", program), cwd=cwd, env=env, icarus_dir=icarus_dir)
