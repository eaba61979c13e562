"""Records of running utility commands, so that what a dead runtime left running is killed
before the cast runs the command again.

A utility command runs in its own session (process group) with ``CASTOR_VISIT_ID`` (its
dispatch's visit id, which starts with the cast id) and ``CASTOR_RUNTIME_PID`` in its
environment. When its runtime dies by ``kill -9`` the tree is reparented to init and keeps
running, with no deadline; a recast in a new process would then start a second copy beside it.
So every command leaves a record in its cast's run directory while it may run:

| when | what happens |
|---|---|
| before a command is started | ``<runDir>/.commands/<visit>.json`` = ``{visit_id}`` (so a kill at any instant after the start leaves it) |
| it ends, however | the record is removed |
| a CastActor starts on a saved state (recast, restart) | :func:`kill_recorded`: every process whose environment says it runs one of the recorded visits *of this cast* is killed (SIGKILL) with its descendants; the records are removed |

Guarantees: a record is read from the project tree, so it is never trusted to *name* a process:
it only names visit ids, and a process is killed only if its own environment carries one of
them (``/proc/<pid>/environ``, readable for the user's own processes) and the id belongs to
this cast. A planted record can therefore only ever reach this cast's own commands.

Limits: a descendant that both cleared its environment and outlived its parent cannot be found
(that would take a cgroup); one whose parent still runs dies as a descendant.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psutil
from loguru import logger

from castor.adapters.fs import atomic_write_bytes

RECORDS_DIR = ".commands"
VISIT_ID_ENV = "CASTOR_VISIT_ID"
RUNTIME_PID_ENV = "CASTOR_RUNTIME_PID"


def record_path(run_dir: str | os.PathLike[str], visit_id: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", visit_id)[:120] or "_"
    return Path(run_dir) / RECORDS_DIR / f"{name}.json"


def record_running(path: Path, visit_id: str) -> None:
    """Record, *before* it is started, that the command of ``visit_id`` may be running."""
    path.parent.mkdir(exist_ok=True)
    atomic_write_bytes(path, json.dumps({"visit_id": visit_id}).encode("utf-8"), sync_dir=False)


def forget(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def kill_recorded(run_dir: str | os.PathLike[str], cast_id: str) -> list[int]:
    """Kill the processes of this cast's recorded visits that still run; remove the records.
    Returns the pids killed."""
    directory = Path(run_dir) / RECORDS_DIR
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return []
    visits = set()
    for path in files:
        try:
            visit = json.loads(path.read_text(encoding="utf-8")).get("visit_id")
        except (OSError, ValueError, AttributeError):
            visit = None
        if isinstance(visit, str) and visit.startswith(f"{cast_id}:"):
            visits.add(visit)
    killed = kill_tagged(VISIT_ID_ENV, visits) if visits else []
    if killed:
        logger.warning("killed {n} process(es) of cast {cast} left running by a runtime that died (visits {v})",
                       n=len(killed), cast=cast_id, v=sorted(visits))
    for path in files:
        forget(path)
    return killed


def kill_tagged(variable: str, values: set[str]) -> list[int]:
    """SIGKILL every process (not this one) whose environment sets ``variable`` to one of
    ``values``, and every descendant of those; collected first, then killed. Returns the pids
    of the processes that were alive (zombies are not counted)."""
    me = os.getpid()
    victims: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(variable) in values:
                victims[proc.pid] = proc
                for child in proc.children(recursive=True):
                    victims.setdefault(child.pid, child)
        except (psutil.Error, OSError):
            continue
    killed = []
    for proc in victims.values():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            pass
    return killed
