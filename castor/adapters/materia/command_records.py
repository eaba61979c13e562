"""Records of running utility commands, so that what a dead runtime left running is killed
before the cast runs the command again.

A utility command runs in its own session (process group). When its runtime dies by
``kill -9`` the tree is reparented to init and keeps running, with no deadline; a recast in a
new process would then start a second copy beside it. So every command leaves a record in its
cast's run directory while it runs:

| when | what happens |
|---|---|
| a command starts | ``<runDir>/.commands/<visit>.json`` = ``{pid, pgid, create_time, visit_id, argv0}`` |
| it ends, however | the record is removed |
| a CastActor starts on a saved state (recast, restart) | :func:`kill_recorded`: each recorded group still running is killed (SIGKILL, with every descendant of its members), then the record is removed |

Guarantees: only the recorded group is killed, never a stranger reusing its numbers. While
any member of a process group lives, the kernel does not hand its id out again; so if the
leader is gone, the members still in that group are the command's. If a process with the
leader's pid lives but was created at another time, the id was reused: nothing is killed.

Limits: a grandchild that left the group (``setsid``) *after* its parent died cannot be found
here (that would take a cgroup); one that left while its parent lived is a descendant and dies.
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


def record_path(run_dir: str | os.PathLike[str], visit_id: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", visit_id)[:120] or "_"
    return Path(run_dir) / RECORDS_DIR / f"{name}.json"


def record_running(path: Path, visit_id: str, pid: int, argv0: str) -> None:
    """Record the command ``pid`` (a session leader: its group id is its pid) at ``path``."""
    try:
        create_time = psutil.Process(pid).create_time()
    except psutil.Error:
        return  # already gone: nothing can be left running
    path.parent.mkdir(exist_ok=True)
    record = {"pid": pid, "pgid": pid, "create_time": create_time, "visit_id": visit_id, "argv0": argv0}
    atomic_write_bytes(path, json.dumps(record).encode("utf-8"), sync_dir=False)


def forget(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def kill_recorded(run_dir: str | os.PathLike[str]) -> list[int]:
    """Kill what the records under ``run_dir`` say is still running; remove them. Returns the
    pids killed."""
    directory = Path(run_dir) / RECORDS_DIR
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return []
    killed: list[int] = []
    for path in files:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            pgid, pid, created = int(record["pgid"]), int(record["pid"]), float(record["create_time"])
        except (OSError, ValueError, KeyError, TypeError):
            record = None
        if record is not None:
            victims = _group_members(pgid, pid, created)
            for proc in victims:
                try:
                    proc.kill()
                    killed.append(proc.pid)
                except psutil.Error:
                    pass
            if victims:
                logger.warning("killed {n} process(es) of utility command {argv0} ({visit}) left running by a "
                               "runtime that died", n=len(victims), argv0=record.get("argv0"),
                               visit=record.get("visit_id"))
        forget(path)
    return killed


def _group_members(pgid: int, leader_pid: int, created: float) -> list[psutil.Process]:
    try:
        leader = psutil.Process(leader_pid)
        if abs(leader.create_time() - created) > 0.01:
            return []  # that pid now belongs to another process: not ours
    except psutil.NoSuchProcess:
        pass  # the leader died; members still in its group are the command's
    except psutil.Error:
        return []
    members: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members[proc.pid] = proc
                for child in proc.children(recursive=True):
                    members.setdefault(child.pid, child)
        except (OSError, psutil.Error):
            continue
    return list(members.values())
