"""Records of running utility commands, so that what a dead runtime left running is killed
before the cast runs the command again.

A utility command runs in its own session (process group) with ``CASTOR_VISIT_ID`` (its
dispatch's visit id, which starts with the cast id), ``CASTOR_RUN_DIR`` (its cast's run
directory) and ``CASTOR_RUNTIME_PID`` in its environment. When its runtime dies by ``kill -9`` the tree is reparented to
init and keeps running, with no deadline; a recast in a new process would then start a second copy beside it.
So every command leaves a record in its cast's run directory while it may run:

| when | what happens |
|---|---|
| before a command is started | ``<runDir>/.commands/<visit>.json`` = ``{visit_id}`` (atomic, fsynced with its directory: a kill, or a power cut, at any instant after the start leaves it) |
| it ends with an outcome (an exit, a signal, its deadline) | :func:`record_outcome`: the record becomes ``{visit_id, outcome}`` (atomic, fsynced) *before* the cast is told, and stays until the cast has saved that outcome (:func:`forget`) |
| it is killed (lost work) or never starts | the record is removed |
| it runs on a cluster (a cast host's, ``castor.scaleout``) | the record also says how long it may run on after its host is lost (``clusterFenceS``: its lease and margin); a runtime that takes the cast up with such a record left (its host died, or was taken for lost, before the command's end was seen) holds the cast's commands that long (:func:`cluster_fence_s`): the copy on the cluster is out of :func:`kill_recorded`'s reach |
| a CastActor starts on a saved state (recast, restart) | :func:`started_without_outcome`: whether the command the saved state still waits for was running when its runtime died (it is run again, and the cast says so); :func:`finished_outcome`: the outcome of the command the saved state still waits for, if its record has one -- the cast takes it instead of running the command again (it ended just before its runtime died, its outcome not yet saved); then :func:`kill_recorded`: every process whose environment says it runs one of the recorded visits *of this cast, in this run directory* is killed (SIGKILL) with its descendants; the records are removed, but the one whose outcome the cast takes (removed once that is saved) |

Guarantees: a record is read from the project tree, so it is never trusted to *name* a process:
it only names visit ids, and a process is killed only if its own environment carries one of
them (``/proc/<pid>/environ``, readable for the user's own processes), the id belongs to this
cast, and its ``CASTOR_RUN_DIR`` is this run directory (a copy of the project cannot reach the
original's commands). A planted record can therefore only ever reach this cast's own commands.
A ``.commands`` that is not a real directory (a planted symlink) is never listed, written or
emptied: the records are skipped, with a warning.

Limits: a descendant that both cleared its environment and outlived its parent cannot be found
(that would take a cgroup); one whose parent still runs dies as a descendant.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from castor._log import logger
from castor.adapters.fs import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    atomic_write_bytes,
    fsync_dir,
    make_dir,
    read_regular_file,
)
from castor.ports.utility_runner import RUN_DIR_ENV as RUN_DIR_ENV
from castor.ports.utility_runner import RUNTIME_PID_ENV as RUNTIME_PID_ENV
from castor.ports.utility_runner import VISIT_ID_ENV as VISIT_ID_ENV

RECORDS_DIR = ".commands"


def _real_dir(directory: Path) -> bool:
    """A directory that is not a symlink (``lstat``): what a run dir's ``.commands`` must be."""
    try:
        return stat.S_ISDIR(os.lstat(directory).st_mode)
    except OSError:
        return False


def record_path(run_dir: str | os.PathLike[str], visit_id: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", visit_id)[:120] or "_"
    return Path(run_dir) / RECORDS_DIR / f"{name}.json"


def record_running(path: Path, visit_id: str, *, cluster_fence_s: float | None = None) -> bool:
    """Record, *before* it is started, that the command of ``visit_id`` may be running. False
    (nothing written, a warning) when ``.commands`` is not a real directory. ``cluster_fence_s``: the
    command runs on a cluster (``castor.scaleout``), where nothing here can find or kill it, and
    may run on that long after its cast host is taken for lost (its lease and margin).

    Durable, as the cast's state file is: the record is fsynced, and so is ``.commands`` (the
    record's name in it) and, when ``.commands`` is made now, the run directory -- a power cut after
    the command started leaves the record, so the next holder still says it runs the command again."""
    try:
        make_dir(path.parent, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    else:
        fsync_dir(path.parent.parent)
    if not _real_dir(path.parent):
        logger.warning("{dir} is not a directory; the command of {visit} runs unrecorded", dir=path.parent,
                       visit=visit_id)
        return False
    record: dict[str, Any] = {"visit_id": visit_id}
    if cluster_fence_s is not None:
        record[CLUSTER_FENCE_KEY] = cluster_fence_s
    atomic_write_bytes(path, json.dumps(record).encode("utf-8"), mode=PRIVATE_FILE_MODE)
    return True


#: In a command's record: how long the command, run on a cluster, may run on after its cast host
#: is lost (see :func:`record_running` and :func:`cluster_fence_s`).
CLUSTER_FENCE_KEY = "clusterFenceS"
#: The longest figure a record may give: the longest lease a cluster command may have
#: (``RayBackendSettings.command_lease_s`` is at most 3600 s) and its margin (3 s).
MAX_CLUSTER_FENCE_S = 3600.0 + 3.0


def cluster_fence_s(run_dir: str | os.PathLike[str], cast_id: str) -> float:
    """How long a runtime taking up this cast must hold its commands: the longest
    ``cluster_fence_s`` of this cast's records that have no outcome (0 when there is none). Such a
    record is a command a cast host started on a cluster and never saw end -- the host died, or was
    taken for lost -- and it may still run on another machine, where :func:`kill_recorded` cannot
    reach it, until its lease lapses: at most that long after its host was lost, which was before
    now. A figure that is not a number in range is read as the longest one."""
    directory = Path(run_dir) / RECORDS_DIR
    if not _real_dir(directory):
        return 0.0
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return 0.0
    longest = 0.0
    for path in files:
        try:
            record = json.loads(read_regular_file(path, 64 * 1024))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(record, dict) or CLUSTER_FENCE_KEY not in record or "outcome" in record:
            continue
        visit = record.get("visit_id")
        if not isinstance(visit, str) or not visit.startswith(f"{cast_id}:"):
            continue
        fence = record[CLUSTER_FENCE_KEY]
        in_range = isinstance(fence, (int, float)) and not isinstance(fence, bool) and 0 <= fence <= MAX_CLUSTER_FENCE_S
        longest = max(longest, float(fence) if in_range else MAX_CLUSTER_FENCE_S)
    return longest


def record_outcome(path: Path, visit_id: str, outcome: dict[str, Any]) -> None:
    """Write the outcome of the command of ``visit_id``, which has just ended, into its record --
    durably (fsynced, the directory too), before the cast is told -- so that a runtime killed
    before the cast saved it leaves it for the next one (:func:`finished_outcome`). Only over the
    record :func:`record_running` wrote."""
    atomic_write_bytes(path, json.dumps({"visit_id": visit_id, "outcome": outcome}).encode("utf-8"),
                       mode=PRIVATE_FILE_MODE)


def finished_outcome(run_dir: str | os.PathLike[str], cast_id: str, visit_id: str) -> dict[str, Any] | None:
    """The outcome :func:`record_outcome` left for the command of ``visit_id`` (a visit of this
    cast), else None: no record, no outcome in it, or a record castor cannot read (a planted
    ``.commands``, a FIFO, a link, not JSON) -- then the command runs again, as before."""
    record = _record(run_dir, cast_id, visit_id)
    outcome = record.get("outcome") if record is not None else None
    return outcome if isinstance(outcome, dict) else None


def started_without_outcome(run_dir: str | os.PathLike[str], cast_id: str, visit_id: str) -> bool:
    """True when the command of ``visit_id`` (a visit of this cast) was started -- its record is
    written before the start -- and no outcome was recorded: it was still running when its runtime
    died (or was killed with it), so a re-dispatch runs it a second time. False when there is no
    record (it never started, or ended as lost work), when it has an outcome, or when castor cannot
    read it."""
    record = _record(run_dir, cast_id, visit_id)
    return record is not None and "outcome" not in record


def _record(run_dir: str | os.PathLike[str], cast_id: str, visit_id: str) -> dict[str, Any] | None:
    """The record of ``visit_id`` as :func:`record_running` / :func:`record_outcome` wrote it, else
    None (not this cast's visit, no record, or one castor cannot read: see finished_outcome)."""
    if not visit_id.startswith(f"{cast_id}:"):
        return None
    path = record_path(run_dir, visit_id)
    if not _real_dir(path.parent):
        return None
    try:
        record = json.loads(read_regular_file(path, 64 * 1024 * 1024, follow_links=False))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("visit_id") != visit_id:
        return None
    return record


def forget(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def kill_recorded(run_dir: str | os.PathLike[str], cast_id: str, *, keep: str | None = None) -> list[int]:
    """Kill the processes of this cast's recorded visits that still run; remove the records but
    ``keep``'s (a visit whose recorded outcome the cast takes: removed once it is saved). Returns
    the pids killed."""
    directory = Path(run_dir) / RECORDS_DIR
    if not _real_dir(directory):
        if os.path.lexists(directory):
            logger.warning("{dir} is not a directory; its records are ignored", dir=directory)
        return []
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return []
    visits = set()
    for path in files:
        try:
            # a FIFO planted in its place is refused at once (read_text waited for a writer for ever)
            visit = json.loads(read_regular_file(path, 64 * 1024)).get("visit_id")
        except (OSError, ValueError, RecursionError, AttributeError):
            visit = None
        if isinstance(visit, str) and visit.startswith(f"{cast_id}:"):
            visits.add(visit)
    run_dir_tag = os.fspath(run_dir)
    killed = kill_tagged(lambda env: env.get(VISIT_ID_ENV) in visits and env.get(RUN_DIR_ENV) == run_dir_tag) \
        if visits else []
    if killed:
        logger.warning("killed {n} process(es) of cast {cast} left running by a runtime that died (visits {v})",
                       n=len(killed), cast=cast_id, v=sorted(visits))
    kept = record_path(run_dir, keep) if keep is not None else None
    for path in files:
        if path != kept:
            forget(path)
    return killed


def running_command(run_dir: str | os.PathLike[str], visit_id: str) -> dict[str, Any] | None:
    """The process that runs the utility command of ``visit_id`` in ``run_dir`` now, as another
    process sees it (read only: ``castor status`` of a cast another runtime holds): ``pid``,
    ``command`` (its command line) and ``started_at`` (epoch seconds) of the topmost process of
    castor's user whose environment carries that visit and run directory; None when none runs (or
    none can be read)."""
    key = (os.fspath(run_dir), visit_id)
    return running_commands({key}).get(key)


def running_commands(wanted: set[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """:func:`running_command` of several utility commands at once, each ``(run directory,
    visit id)``, in one pass over the processes (each pass reads every process's environment):
    those found running, by their key."""
    me = os.geteuid()
    found: dict[tuple[str, str], dict[int, psutil.Process]] = {}
    for proc in psutil.process_iter():
        try:
            # castor's user's processes only: another user's may carry any environment it likes
            # (castor run by root reads every process's)
            if proc.uids().effective != me:
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        key = (env.get(RUN_DIR_ENV, ""), env.get(VISIT_ID_ENV, ""))
        if key in wanted:
            found.setdefault(key, {})[proc.pid] = proc
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key, procs in found.items():
        for proc in procs.values():
            try:
                if proc.ppid() in procs or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                out[key] = {"pid": proc.pid, "command": " ".join(proc.cmdline()), "started_at": proc.create_time()}
                break
            except (psutil.Error, OSError):
                continue
    return out


def utility_running(run_dir: str | os.PathLike[str] | None, pending: Any) -> dict[str, Any] | None:
    """What a cast is doing, when it waits for a utility command: the command's process as
    :func:`running_command` finds it (``pid``, ``command``, ``started_at``), or None (the cast awaits
    no utility command, or none runs now). ``pending`` is the cast's pending work as its saved state
    or its live activity has it: a mapping with ``kind`` and ``visit_id``. ``castor status`` and the
    console's cast rows both ask this, so they name the same process."""
    if not run_dir or not isinstance(pending, dict) or pending.get("kind") != "utility":
        return None
    visit_id = pending.get("visit_id")
    return running_command(run_dir, visit_id) if isinstance(visit_id, str) else None


def kill_tagged(match: Callable[[dict[str, str]], bool]) -> list[int]:
    """SIGKILL every process (not this one) whose environment ``match``es, and every descendant
    of those; collected first, then all stopped (SIGSTOP), then killed. Returns the pids of the
    processes that were alive (zombies are not counted).

    Stopped first because they are killed one by one, in pid order, and pids wrap: a child may come
    before its parent, and a parent that outlived its child by a moment ran on -- a script's next
    line after the command it waited for (its "done" mark, or the command's next step) -- in a run
    the recast then repeats. A stopped process runs nothing more before its SIGKILL."""
    me = os.getpid()
    victims: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if match(proc.environ()):
                victims[proc.pid] = proc
                for child in proc.children(recursive=True):
                    victims.setdefault(child.pid, child)
        except (psutil.Error, OSError):
            continue
    alive = []
    for proc in victims.values():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            proc.suspend()  # psutil's: refuses a pid another process took since it was collected
            alive.append(proc)
        except psutil.Error:
            pass
    killed = []
    for proc in alive:
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            pass
    return killed
