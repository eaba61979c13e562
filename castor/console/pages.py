"""The console's pages and the data its live streams push.

Server-side: the data (plain JSON from snapshots and a cast's own files) and a cast's loadout
graph as SVG. Client-side: a page of vanilla JavaScript that renders each pushed document with
``textContent`` only (runtime data is never parsed as HTML), so there is no build step.
"""

from __future__ import annotations

import errno
import html
import json
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

from castor._log import logger
from castor.adapters.fs import open_without_links
from castor.adapters.materia.artifacts import MAX_RUN_FILE_BYTES
from castor.adapters.materia.cast_lease import lease_holder
from castor.adapters.materia.command_records import running_commands, utility_running
from castor.adapters.materia.config_loader import ResolvedConfigCache
from castor.adapters.materia.state_store import list_page
from castor.console.delta import AGES, APPLY_JS, COUNTDOWNS
from castor.console.terminal import session_casts
from castor.messages.errors import Forbidden, InvalidParams, NotFound
from castor.supervision.registry import PACE_EVERY, WATCH_PACE_S, check_segment
from castor.supervision.threads import start_thread

#: Events of a cast's feed shown on its page (the newest).
FEED_EVENTS = 40
#: At most this much of the end of events.jsonl is read for the feed.
FEED_TAIL_BYTES = 256 * 1024
#: run dirs of casts seen live, so a cast's page still finds its files once its actor ended --
#: while its session is open. A closed session's entries go at the next push of the main page
#: (and at the next request for one of them), so nothing is kept per closed session.
_RUN_DIRS: dict[tuple[str, str], str] = {}


#: Casts that ended while the console was watched (seen live, then gone), per open session, the
#: newest last: their outcome read once from their state file. Kept while the session is open.
_ENDED: dict[str, dict[str, dict[str, Any]]] = {}
#: Casts not running here listed per session (the newest; the rest are on its project's cast list,
#: ``/casts/<session>``, a page at a time), and as many again that need attention.
MAX_ENDED_PER_SESSION = 20
#: The newest casts of an open session's project read for the ones not running here (ended,
#: whether or not a page watched, or left by another runtime), each with its status: a cast that
#: ended before any page opened is listed too, and those that failed since the session opened
#: need attention.
SAVED_SCAN = 100
#: Seconds a project's casts read from its cast index stand before they are read again (a cast
#: that ends while a page watches is listed at the next push, from its actor going).
SAVED_REREAD_S = 5.0
#: Casts of one project's cast list page (``/casts/<session>``).
CASTS_PAGE = 100
#: Per open session: when it opened (epoch seconds).
_OPENED: dict[str, float] = {}
#: Per artifact root read: when, the newest :data:`SAVED_SCAN` casts as the page lists them, and
#: how many casts it holds in all. Kept while an open session reads it.
_SAVED: dict[str, tuple[float, list[dict[str, Any]], int]] = {}
#: Seconds a push waits for a project's casts being read: a project castor has not listed yet has
#: no cast index, and building one reads every state.json (seconds for a project of thousands of
#: casts), which held every open page's push meanwhile. Past it the push goes without them (its
#: card shows them at a later push); each read is on a thread of its own, one a root at a time.
SAVED_WAIT_S = 0.25
#: The roots being read now, each with what is set when its read ends; guarded by _SAVED_LOCK (as
#: _SAVED is: a page's push and /api/actors read them on threads of their own).
_READING: dict[str, threading.Event] = {}
_SAVED_LOCK = threading.Lock()
#: Per open session whose artifact root castor refuses (an ``artifactDir`` leading out of its
#: project): why, as ``castor casts`` says it; its saved casts are not read.
_REFUSED: dict[str, str] = {}


#: The open sessions' resolved configs, re-read only when a layer file changed (as a session's own are).
_CONFIGS = ResolvedConfigCache(size=64)


def artifact_root(runtime: Any, sid: str) -> Path:
    """Where session ``sid``'s casts are, by the rule its own casts, ``castor casts`` and ``castor
    status`` follow: the ``artifactDir`` its config names (the config it was opened with, else the
    project's layers; a config that does not load leaves the default), resolved inside its project
    (``forbidden`` when it, or a link on the way, leads out; ``not_found`` once the session closed)."""
    from castor.adapters.materia.config_loader import load
    from castor.domain.materia.config import ConfigError

    info = runtime.session(sid).info
    flags = info.flags or {}
    config_path = flags.get("materia_config") if isinstance(flags.get("materia_config"), str) else None
    try:
        configured = _CONFIGS.load_resolved(info.cwd, config_path=config_path).config.get("artifactDir")
    except ConfigError:  # a config whose loadout does not resolve still names its artifactDir
        try:
            configured = load(info.cwd, config_path=config_path).merged.get("artifactDir")
        except ConfigError:
            configured = None
    root: Path = runtime.artifact_root_for(info.cwd, configured if isinstance(configured, str) and configured
                                           else None)
    return root


def check_ids(*ids: str) -> tuple[str, ...]:
    """Each id is an actor path segment (``invalid_params`` otherwise, a 400): no path tricks."""
    try:
        return tuple(check_segment(ident) for ident in ids)
    except Forbidden as exc:  # the registry's refusal; in a URL it is a bad request, not a forbidden one
        raise InvalidParams(exc.message, data={"reason": "invalid_id"}) from None


# -- data -------------------------------------------------------------------------------------
def tree_data(runtime: Any, moments: dict[int, float] | None = None) -> dict[str, Any]:
    """One push of the main page: every actor, the casts of each session, the Icarus workers.
    ``moments``, when given, gets the clock time (epoch seconds) the figures of each actor, each
    session's cast and each Icarus worker were read at, by the ``id()`` of its mapping in the
    document: what its ages and deadlines count from (see :func:`castor.console.delta.anchor`)."""
    actors = runtime.system.snapshot_data(pace_s=WATCH_PACE_S)["actors"] if moments is None else \
        _read_actors(runtime, moments)
    open_ids = {ctx.info.session_id for ctx in runtime.sessions()}
    for key in [key for key in _RUN_DIRS if key[0] not in open_ids]:
        _RUN_DIRS.pop(key, None)
    for table in (_ENDED, _OPENED, _REFUSED):
        for sid in [sid for sid in table if sid not in open_ids]:
            table.pop(sid, None)
    roots_read: set[str] = set()
    live: set[tuple[str, str]] = set()
    for actor in actors:
        if actor["kind"] == "CastActor":
            parts = actor["path"].split("/")
            if len(parts) == 6:
                live.add((parts[3], parts[5]))
            data = (actor.get("activity") or {}).get("data") or {}
            if data.get("run_dir") and len(parts) == 6:
                if len(_RUN_DIRS) >= 10_000:
                    _RUN_DIRS.clear()  # a bound, not a cache policy: live casts put theirs back at once
                _RUN_DIRS[(parts[3], parts[5])] = str(data["run_dir"])
    for sid, cast_id in live:  # recast or resumed: live again
        _ENDED.get(sid, {}).pop(cast_id, None)
    _note_ended(live)
    sessions = session_casts(actors)
    uptimes = {a["path"]: a.get("uptime_s") for a in actors}
    running = {cast_id for _sid, cast_id in live}
    for session in sessions:
        sid = session["session_id"]
        ended = [{**c, "attention": c["status"] == "failed"} for c in reversed(_ENDED.get(sid, {}).values())]
        seen = {c["cast_id"] for c in ended} | running
        saved, total = _saved_casts(runtime, sid, uptimes.get(session["path"]), roots_read)
        saved = [c for c in saved if c["cast_id"] not in seen]
        listed = sorted(ended + saved, key=lambda c: -c["ended_at"])
        # the newest, and those that need attention (failed since the session opened) as many again
        shown = listed[:MAX_ENDED_PER_SESSION]
        shown += [c for c in listed[MAX_ENDED_PER_SESSION:] if c["attention"]][:MAX_ENDED_PER_SESSION]
        session["ended"] = shown
        session["casts_total"] = total
        session["casts_refused"] = _REFUSED.get(sid)
    with _SAVED_LOCK:
        for root in [root for root in _SAVED if root not in roots_read]:
            _SAVED.pop(root, None)
    _with_commands_running(actors, sessions)
    if moments is not None:  # a session's cast shows its actor's figures, read when its actor's were
        read_at = {actor["path"]: moments[id(actor)] for actor in actors if id(actor) in moments}
        for session in sessions:
            for cast in session["casts"]:
                if cast["path"] in read_at:
                    moments[id(cast)] = read_at[cast["path"]]
    return {"at": time.time(), "actors": actors, "sessions": sessions, "workers": worker_data(runtime, moments)}


#: Seconds what a live cast's utility command is (:func:`_with_commands_running`) stands before it
#: is looked for again: finding it reads every process's environment, and a push comes each second.
COMMAND_REREAD_S = 5.0
#: The longest command line a cast row carries (``castor status`` shows as much).
MAX_COMMAND_CHARS = 200
#: Per live cast's awaited utility (its run directory and visit): when it was looked for, and what was found.
_COMMANDS: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}


def _shown_command(running: dict[str, Any] | None) -> dict[str, Any] | None:
    """A utility command's process as a cast row carries it: ``pid``, ``command`` (cut as
    ``castor status`` cuts it) and ``started_at`` (epoch seconds: the page counts how long)."""
    if running is None:
        return None
    command = str(running["command"])
    if len(command) > MAX_COMMAND_CHARS:
        command = command[:MAX_COMMAND_CHARS - 1] + "\u2026"
    return {"pid": running["pid"], "command": command, "started_at": running["started_at"]}


def _with_commands_running(actors: list[dict[str, Any]], sessions: list[dict[str, Any]]) -> None:
    """Each live cast that awaits a utility command gets ``command_running``: the command's process
    (:func:`_shown_command`), found as ``castor status`` finds it (:func:`running_commands`, what
    :func:`utility_running` asks, one pass for every such cast), looked for again after
    :data:`COMMAND_REREAD_S`; None while none runs (queued for a slot, ended)."""
    awaiting: dict[str, tuple[str, str]] = {}
    for actor in actors:
        data = (actor.get("activity") or {}).get("data") or {}
        if actor["kind"] == "CastActor" and data.get("pending") == "utility" and data.get("run_dir") \
                and isinstance(data.get("visit_id"), str):
            awaiting[actor["path"]] = (str(data["run_dir"]), data["visit_id"])
    now = time.monotonic()
    for gone in [key for key in _COMMANDS if key not in awaiting.values()]:
        _COMMANDS.pop(gone, None)
    stale = {key for key in awaiting.values() if key not in _COMMANDS or now - _COMMANDS[key][0] >= COMMAND_REREAD_S}
    if stale:  # one pass over the processes for all of them
        try:
            running = running_commands(stale)
        except Exception:  # noqa: BLE001 - a process table that cannot be read: none shown
            running = {}
        for key in stale:
            _COMMANDS[key] = (now, _shown_command(running.get(key)))
    for session in sessions:
        for cast in session["casts"]:
            awaited = awaiting.get(cast["path"])
            if awaited is not None:
                cast["command_running"] = _COMMANDS[awaited][1]


def _read_actors(runtime: Any, moments: dict[int, float]) -> list[dict[str, Any]]:
    """Every actor's snapshot, paced as a watcher's snapshot is, each one's reading time noted in
    ``moments`` (by its ``id()``)."""
    actors = []
    for n, handle in enumerate(runtime.system.registry.handles(), 1):
        actors.append(handle.snapshot_data())
        moments[id(actors[-1])] = time.time()
        if n % PACE_EVERY == 0:
            time.sleep(WATCH_PACE_S)
    return actors


def _note_ended(live: set[tuple[str, str]]) -> None:
    """Each cast seen live before and gone now: its outcome (``complete``, ``failed``,
    ``aborted``, ...) and failure reason, read once from its state file, under its session."""
    from castor.adapters.materia.state_store import cast_status

    for sid, cast_id in [key for key in _RUN_DIRS if key not in live]:
        ended = _ENDED.setdefault(sid, {})
        if cast_id in ended:
            continue
        path = Path(_RUN_DIRS[(sid, cast_id)]) / "state.json"
        saved_at: list[float] = []
        state = (_read_json(path, saved_at) or {}).get("state")
        state = state if isinstance(state, dict) else {}
        status, _resumable = cast_status(state)
        reason = state.get("failed_reason") or state.get("failedReason")
        ended_at = saved_at[0] if saved_at else time.time()  # its last save: when it ended
        ended[cast_id] = {"cast_id": cast_id, "status": status,
                          "reason": None if reason is None else str(reason)[:MAX_REASON_CHARS],
                          "phase": state.get("phase"), "ended_at": ended_at}
        while len(ended) > MAX_ENDED_PER_SESSION:
            del ended[next(iter(ended))]


def _saved_casts(runtime: Any, sid: str, uptime_s: float | None,
                 roots_read: set[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """The newest casts of session ``sid``'s project (its artifact root, and the roots of its casts
    seen live), :data:`SAVED_SCAN` of each root as its cast index lists them, read again after
    :data:`SAVED_REREAD_S` (one read a root, whatever the sessions on it), each with its status, how
    it ended and when (its last save), ``attention`` when it failed since the session opened; and
    how many casts the artifact root holds in all. None while the session's casts cannot be read;
    ``roots_read`` gets the roots read or kept."""
    now = time.time()
    if sid not in _OPENED and isinstance(uptime_s, (int, float)):
        _OPENED[sid] = now - uptime_s
    opened = _OPENED.get(sid)
    _REFUSED.pop(sid, None)
    main: Path | None = None
    try:
        main = artifact_root(runtime, sid)
    except Forbidden as exc:  # as castor casts refuses it: said on the session's card
        _REFUSED[sid] = exc.message[:MAX_REASON_CHARS]
    except Exception:  # noqa: BLE001 - a session closing: none read from its config
        pass
    roots = {str(main)} if main is not None else set()
    roots |= {str(Path(run_dir).parent) for (known, _cast), run_dir in list(_RUN_DIRS.items()) if known == sid}
    listed: dict[str, dict[str, Any]] = {}
    total = 0
    for root in sorted(roots):
        if roots_read is not None:
            roots_read.add(root)
        read = _saved_of(root, now)
        if read is None:
            continue
        if main is not None and root == str(main):
            total = read[2]
        for cast in read[1]:
            attention = cast["status"] == "failed" and opened is not None and cast["ended_at"] >= opened
            listed.setdefault(cast["cast_id"], {**cast, "attention": attention})
    return sorted(listed.values(), key=lambda c: -c["ended_at"]), total


def _saved_of(root: str, now: float) -> tuple[float, list[dict[str, Any]], int] | None:
    """What the newest read of ``root``'s casts found (None before any ended). A read older than
    :data:`SAVED_REREAD_S` starts another on a thread of its own (unless one runs), which the
    caller waits for :data:`SAVED_WAIT_S` at most."""
    with _SAVED_LOCK:
        read = _SAVED.get(root)
        if read is not None and now - read[0] < SAVED_REREAD_S:
            return read
        ended = _READING.get(root)
        if ended is None:
            ended = _READING[root] = threading.Event()
            start_thread(_read_saved, args=(root, ended), name="castor-console-casts", owner="/console",
                         purpose="reads a project's casts for the console")
    if ended.wait(SAVED_WAIT_S):
        with _SAVED_LOCK:
            return _SAVED.get(root)
    return read


def _read_saved(root: str, ended: threading.Event) -> None:
    """Read the newest :data:`SAVED_SCAN` casts of ``root`` into :data:`_SAVED` (a root that cannot be
    read keeps what an earlier read found, or none), then set ``ended``."""
    read = None
    try:
        page = list_page(root, limit=SAVED_SCAN)
        read = (time.time(), [_with_holder(root, _saved_row(cast)) for cast in page.casts]
                + [_unreadable_row(problem) for problem in page.problems], page.total)
    except Exception:  # noqa: BLE001 - an unreadable project must not blank the page
        logger.bind(actor="/console").opt(exception=True).debug("console: the casts under {} not read", root)
    finally:
        with _SAVED_LOCK:
            if read is None:  # read again after SAVED_REREAD_S, not at every push meanwhile
                before = _SAVED.get(root)
                read = (time.time(), before[1] if before else [], before[2] if before else 0)
            _SAVED[root] = read
            _READING.pop(root, None)
        ended.set()


def _saved_row(cast: Any) -> dict[str, Any]:
    """A cast of a project's listing (a ``CastSummary``) as the page lists it."""
    reason = cast.failed_reason
    return {"cast_id": cast.cast_id, "status": cast.status,
            "reason": None if reason is None else str(reason)[:MAX_REASON_CHARS],
            "phase": cast.current_socket, "ended_at": _epoch(cast.updated_at) or 0.0}


#: How a cast's listing says it has ended (whatever else it says, it has not: its lease may be held).
_ENDED_STATUSES = frozenset({"complete", "failed", "aborted"})


def _with_holder(root: str, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``held_by`` when it has not ended: the process that holds its lease (``pid`` and
    ``command``, its command line), as ``castor status`` names it (None when none does: its runtime
    stopped, or the holder cannot be told)."""
    if row["status"] not in _ENDED_STATUSES:
        row["held_by"] = lease_holder(Path(root) / row["cast_id"])
        row["command_running"] = _saved_command_running(root, row["cast_id"])
    return row


def _saved_command_running(root: str, cast_id: str) -> dict[str, Any] | None:
    """The utility command a cast not running here awaits, as its saved state says, when its
    process runs now (its holder's, or left running by a runtime that was killed), as ``castor
    status`` names it (:func:`utility_running`); None otherwise, or when its state cannot be read."""
    from castor.adapters.materia.storage import FILE_CAST_STORAGE

    try:
        document = FILE_CAST_STORAGE.store(Path(root)).load(cast_id).state
        pending = document.get("pending") if isinstance(document, dict) else None
        if not isinstance(pending, dict) or pending.get("kind") != "utility":
            return None
        shown = _shown_command(utility_running(f"{root}/{cast_id}", pending))
        if shown is not None:  # no runtime holds the cast (one was killed): the command runs on, unowned
            shown["orphaned"] = not FILE_CAST_STORAGE.lease_held(Path(root), cast_id)
        return shown
    except Exception:  # noqa: BLE001 - a state it cannot read says nothing more here
        return None


def _unreadable_row(problem: Any) -> dict[str, Any]:
    """A run directory of a project's listing whose state castor cannot read, as the page lists it."""
    return {"cast_id": problem.cast_id, "status": "unreadable", "reason": str(problem.reason)[:MAX_REASON_CHARS],
            "phase": problem.current_socket, "ended_at": 0.0}


def _epoch(iso: str) -> float | None:
    """The epoch seconds of an ISO 8601 time (a cast's ``updated_at``), None if it is none."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def worker_data(runtime: Any, moments: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """The Icarus worker of each session that has one (its actor's mailbox, its process); each
    one's reading time noted in ``moments`` when given (see :func:`tree_data`)."""
    from castor.actors.icarus.component import session_of

    out = []
    for ctx in runtime.sessions():
        try:
            sess = session_of(ctx)
        except NotFound:
            continue
        try:
            stats = sess.worker_stats()
        except Exception as exc:  # noqa: BLE001 - one session's stats must not blank the page
            stats = {"session_id": ctx.info.session_id, "error": f"{type(exc).__name__}"}
        if moments is not None:
            moments[id(stats)] = time.time()
        out.append(stats)
    return out


def _run_dir(runtime: Any, sid: str, cast_id: str) -> Path:
    """Where the cast's files are, while its session is open (``not_found`` once it closed: the
    console shows this runtime's sessions; ``castor status ID`` in the project reads a closed
    session's cast from its files)."""
    try:
        runtime.session(sid)
    except NotFound:
        _RUN_DIRS.pop((sid, cast_id), None)
        raise NotFound(f"no open session {sid} (a closed session's casts are read with `castor status` "
                       "in their project)", data={"session_id": sid, "cast_id": cast_id,
                                                  "reason": "session_closed"}) from None
    known = _RUN_DIRS.get((sid, cast_id))
    if known is None:
        handle = runtime.system.find(f"/root/session/{sid}/cast/{cast_id}")
        data = (handle.snapshot_data().get("activity") or {}).get("data") if handle is not None else None
        known = (data or {}).get("run_dir")
    if known is None:
        # A saved cast is looked for as `castor casts` lists it: under the session's artifact root
        # (its configured artifactDir; ``forbidden`` when it or a link leads out of the project), in
        # a run directory that is no link -- a project may ship one leading to another project's or
        # user's cast.
        candidate = artifact_root(runtime, sid) / cast_id
        try:
            linked = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            linked = False
        if linked:
            raise Forbidden(f"cast {cast_id}'s run directory {candidate} is a symbolic link, which castor never "
                            "follows (`castor casts` leaves it out)",
                            data={"cast_id": cast_id, "reason": "run_directory_is_a_link", "path": str(candidate)})
        found = _open_run_file(candidate / "state.json")  # not through a link anywhere on its way
        if found is None:
            raise NotFound(f"no cast {cast_id} in session {sid}", data={"cast_id": cast_id})
        os.close(found)
        known = str(candidate)
    _RUN_DIRS[(sid, cast_id)] = known
    return Path(known)


def _open_run_file(path: Path) -> int | None:
    """A descriptor of ``path`` when it is a regular file, else None: the project may ship a
    cast's directory, so a link (whose target is anywhere), a FIFO (which would hold the console's
    handler until a writer came) or a device in a file's place is never read. Opened a component
    at a time, none of them followed if it is a link (:func:`~castor.adapters.fs.open_without_links`):
    a directory on the way (the cast's run directory, the artifact root or one above it) swapped
    for a link since castor found it never leads the read out of the project."""
    try:
        fd = open_without_links(path)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _read_json(path: Path, modified: list[float] | None = None) -> Any:
    """The JSON document in ``path`` (a regular file, :func:`_open_run_file`, of at most castor's
    bound for run files: a larger one, which a sparse file makes at no disk cost, is unread), else
    None; ``modified``, when given, gets the file's modification time (of the file read, never one
    a link leads to)."""
    fd = _open_run_file(path)
    if fd is None:
        return None
    try:
        with open(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if modified is not None:
                modified.append(st.st_mtime)
            if st.st_size > MAX_RUN_FILE_BYTES:
                return None
            raw = handle.read(MAX_RUN_FILE_BYTES + 1)
        return json.loads(raw) if len(raw) <= MAX_RUN_FILE_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None


def _feed(path: Path) -> list[dict[str, Any]]:
    """The newest events of ``events.jsonl``, each with its ``event_id`` (where its line starts in
    the file); a torn last line is skipped, never fatal; a link or anything but a regular file
    shows none."""
    fd = _open_run_file(path)
    if fd is None:
        return []
    try:
        with open(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - FEED_TAIL_BYTES)
            f.seek(start)
            tail = f.read(FEED_TAIL_BYTES)
    except OSError:
        return []
    lines, offset = [], start
    for line in tail.split(b"\n"):
        lines.append((offset, line))
        offset += len(line) + 1
    events = []
    for offset, line in lines[-FEED_EVENTS - 2:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            summary = json.dumps(event.get("data"), ensure_ascii=False)
            # where its line starts in the file: what tells it from every other event of the feed (a
            # push sends the events that joined it, not the whole feed again)
            events.append({"event_id": str(offset), "ts": event.get("ts"), "type": str(event.get("type")),
                           "data": summary if len(summary) <= 300 else summary[:299] + "…"})
    return events[-FEED_EVENTS:]


def _refuse_a_linked_run_dir(sid: str, cast_id: str, run_dir: Path) -> None:
    """``forbidden`` (a 403; on a stream, its push's ``error``) when ``run_dir`` is reached through
    a symbolic link now -- the run directory, the artifact root or a directory above it swapped
    for one since castor found it -- and the run directory is forgotten; nothing through the link
    is read. A run directory gone or replaced by a file is no refusal: its files read as none."""
    try:
        fd = open_without_links(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return
        _RUN_DIRS.pop((sid, cast_id), None)
        raise Forbidden(f"cast {cast_id}'s run directory {run_dir} is reached through a symbolic link now "
                        f"({exc.filename}), which castor never follows: nothing behind it is shown",
                        data={"cast_id": cast_id, "reason": "run_directory_is_a_link",
                              "path": str(exc.filename)}) from None
    os.close(fd)


def cast_data(runtime: Any, sid: str, cast_id: str) -> dict[str, Any]:
    """One push of a cast's page: its state, the graph (SVG), the newest events, its usage. Every
    file is read without following a link anywhere on its path (``forbidden`` when its run
    directory is reached through one, :func:`_refuse_a_linked_run_dir`)."""
    run_dir = _run_dir(runtime, sid, cast_id)
    _refuse_a_linked_run_dir(sid, cast_id, run_dir)
    stored = _read_json(run_dir / "state.json") or {}
    state = stored.get("state") or {}
    usage = _read_json(run_dir / "usage.json") or {}
    handle = runtime.system.find(f"/root/session/{sid}/cast/{cast_id}")
    live = handle.snapshot_data() if handle is not None else None
    sockets = [a for a in runtime.system.snapshot_data(f"/root/session/{sid}/socket")["actors"]
               if a["path"].rsplit("/", 1)[-1].startswith(f"{cast_id}.")]
    return {
        "at": time.time(),
        "session_id": sid,
        "cast_id": cast_id,
        "run_dir": str(run_dir),
        "phase": state.get("phase"),
        "active": state.get("active"),
        "current_socket": state.get("current_socket_id"),
        "item": state.get("current_item_label") or state.get("current_item_key"),
        "visits": state.get("visits") or {},
        "failed_reason": state.get("failed_reason"),
        "request": str(state.get("request") or "")[:500],
        "svg": loadout_svg(state),
        "events": _feed(run_dir / "events.jsonl"),
        "usage": {
            "tokens": (usage.get("tokens") or {}).get("total"),
            "cost_usd": (usage.get("cost") or {}).get("total"),
            "turns": len(usage.get("turns") or []),
            "by_socket": usage.get("bySocket") or {},
        },
        "actor": live,
        "socket_actors": sockets,
    }


# -- the loadout graph -----------------------------------------------------------------------
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 170, 54, 60, 22, 24


def _layers(entry: str, sockets: dict[str, Any]) -> dict[str, int]:
    """Column of each socket: its breadth-first distance from the entry (unreached ones last)."""
    layer = {entry: 0} if entry in sockets else {}
    queue = [entry] if entry in sockets else []
    while queue:
        node = queue.pop(0)
        for edge in (sockets[node].get("socket") or {}).get("edges") or []:
            to = edge.get("to")
            if to in sockets and to not in layer:
                layer[to] = layer[node] + 1
                queue.append(to)
    last = max(layer.values(), default=-1) + 1
    for sid in sockets:
        layer.setdefault(sid, last)
    return layer


_HIDDEN = re.compile("[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def visible_html(text: str) -> str:
    """``text`` escaped for HTML, its controls and bidirectional overrides as ``\\uXXXX`` escapes
    (what the pages' ``visible`` does on the client): a socket or materia name with U+202E in it
    would otherwise display reversed. So is a lone surrogate (a project's JSON may hold one as an
    escape, a file name that is no UTF-8 decodes to them), which no page could be encoded with."""
    return html.escape(_HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", str(text)))


def loadout_svg(state: dict[str, Any]) -> str:
    """The cast's loadout as an SVG: a box per socket (the current one highlighted, visited ones
    tinted, each with its visit count), an arrow per edge labelled with its condition."""
    pipeline = ((state.get("config") or {}).get("pipeline") or {})
    sockets: dict[str, Any] = pipeline.get("sockets") or {}
    if not sockets:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="300" height="40">'
            '<text x="10" y="25">no loadout</text></svg>'
        )
    entry = pipeline.get("entry") or next(iter(sockets))
    current = state.get("current_socket_id") if state.get("active") else None
    visits = state.get("visits") or {}
    layers = _layers(entry, sockets)
    rows: dict[int, int] = {}
    pos: dict[str, tuple[int, int]] = {}
    for sid in sockets:
        column = layers[sid]
        row = rows.get(column, 0)
        rows[column] = row + 1
        pos[sid] = (PAD + column * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    width = PAD * 2 + (max(layers.values()) + 1) * (BOX_W + GAP_X)
    height = PAD * 2 + max(rows.values()) * (BOX_H + GAP_Y) + 60
    e = visible_html
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="loadout" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>']
    for sid, spec in sockets.items():
        x1, y1 = pos[sid]
        for edge in (spec.get("socket") or {}).get("edges") or []:
            to = edge.get("to")
            if to not in pos:
                continue
            x2, y2 = pos[to]
            when = str(edge.get("when") or "always")
            if layers[to] > layers[sid]:
                sx, sy, tx, ty = x1 + BOX_W, y1 + BOX_H // 2, x2, y2 + BOX_H // 2
                mx = (sx + tx) // 2
                path = f"M {sx} {sy} C {mx} {sy}, {mx} {ty}, {tx} {ty}"
                lx, ly = mx, (sy + ty) // 2 - 4
            else:  # a loop back (or a sideways edge): under the boxes
                sx, sy, tx, ty = x1 + BOX_W // 2, y1 + BOX_H, x2 + BOX_W // 2, y2 + BOX_H
                dip = max(sy, ty) + 30 + 6 * abs(layers[sid] - layers[to])
                path = f"M {sx} {sy} C {sx} {dip}, {tx} {dip}, {tx} {ty}"
                lx, ly = (sx + tx) // 2, dip - 4
            out.append(f'<path class="edge" data-from="{e(sid)}" data-to="{e(str(to))}" d="{path}" fill="none" '
                       f'stroke="#555" stroke-width="1.4" marker-end="url(#arrow)"/>')
            if when != "always":
                out.append(f'<text x="{lx}" y="{ly}" text-anchor="middle" fill="#444" font-size="10">{e(when)}</text>')
    for sid, spec in sockets.items():
        x, y = pos[sid]
        socket = spec.get("socket") or {}
        is_current = sid == current
        fill = "#ffd54f" if is_current else ("#c8e6c9" if visits.get(sid) else "#ffffff")
        stroke, width_px = ("#e65100", 3) if is_current else ("#37474f", 1.2)
        what = spec.get("materia_name") if socket.get("type") == "agent" else \
            ("utility " + str(socket.get("utility") or " ".join(map(str, (socket.get("command") or [])[:1]))))
        label = f"{sid}" + (" ▶" if sid == entry else "")
        out.append(f'<g class="socket{" current" if is_current else ""}" data-socket="{e(sid)}">'
                   f'<rect x="{x}" y="{y}" rx="8" width="{BOX_W}" height="{BOX_H}" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="{width_px}"/>'
                   f'<text x="{x + 10}" y="{y + 20}" font-weight="bold">{e(label)}</text>'
                   f'<text x="{x + 10}" y="{y + 38}" fill="#333">{e(str(what or "-")[:24])}</text>'
                   f'<text x="{x + BOX_W - 10}" y="{y + 20}" text-anchor="end" fill="#1b5e20">'
                   f'{"×" + e(str(visits[sid])) if visits.get(sid) else ""}</text></g>')
    out.append("</svg>")
    return "".join(out)


# -- pages ------------------------------------------------------------------------------------
#: Rows of the actor tree a page draws at once (the rest are counted, and the filter finds them):
#: a runtime of 1,000 casts has thousands of actors, and redrawing them all every second froze
#: the page.
MAX_TREE_ROWS = 300
#: Casts listed on one session's card (the rest are counted).
MAX_CARD_CASTS = 25
#: Casts that ended while the console watched, listed on a session's card (the newest; the rest counted).
MAX_CARD_ENDED = 5
#: Session cards, and Icarus worker cards, drawn at once (the rest are counted).
MAX_CARDS = 50
#: Entries of "needs attention" drawn at once (the rest are counted).
MAX_ATTENTION = 100
#: Characters of one text others chose (a path segment, a label, an activity) a cell shows; the
#: whole of it, up to :data:`MAX_TITLE_CHARS`, is the cell's tooltip.
MAX_CELL_CHARS = 160
MAX_TITLE_CHARS = 2000
#: Characters of why an actor needs attention, or how a cast ended (its failure's reason), shown.
MAX_REASON_CHARS = 600
#: An actor that has handled one message this long, or whose oldest queued message waited this
#: long, is listed under "needs attention" (a handler that never returns holds its mailbox).
STUCK_AFTER_S = 10.0
#: A failure this recent is listed under "needs attention" (a crash loop shows while it loops).
RECENT_FAILURE_S = 60.0
#: Seconds without a push after which a page says its figures are stale (pushes come every second).
STALE_AFTER_S = 3.5
#: A page whose stream dropped tries again after this many milliseconds, then twice as long after
#: each try that fails, up to :data:`RETRY_MAX_MS`; a push puts it back to the first.
RETRY_FIRST_MS = 500
RETRY_MAX_MS = 8000
#: The pages' one live region: a screen reader is told what it says (a change of the connection's
#: state, of "needs attention"), not every push.
_ANNOUNCER = '<div id="announce" class="announce" role="status"></div>'

_STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:12px;background:#fff}
td,th{border-bottom:1px solid #e0e0e0;padding:3px 8px;text-align:left;vertical-align:middle;white-space:nowrap}
th{background:#eceff1;position:sticky;top:0}
.bar{display:inline-block;height:9px;background:#42a5f5;vertical-align:middle;margin-right:4px}
.bar.age{background:#ef6c00}
.restarted{background:#ffebee;color:#b71c1c;font-weight:bold}
.muted{color:#888} .state-running{color:#2e7d32} .state-crashed,.state-failed{color:#c62828}
.state-retired{color:#6a1b9a} a{color:#1565c0}
a:focus-visible,input:focus-visible{outline:2px solid #e65100;outline-offset:1px}
#status{font-size:12px;color:#666}
body.stale #status{color:#b71c1c;font-weight:bold}
body.stale .live{opacity:.45}
.scroll{overflow-x:auto;max-width:100%}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 10px;font-size:12px;min-width:260px;
max-width:100%;box-sizing:border-box;overflow-wrap:anywhere}
#attention li{margin:2px 0}
.announce{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);white-space:nowrap}
td.long{white-space:pre-wrap;overflow-wrap:anywhere;min-width:20ch;max-width:100ch}
"""

_COMMON_JS = r"""
// Text others chose, shown as it is written: a control or a bidirectional override (U+202E in
// "safe\u202etxt.exe" displays "safeexe.txt") appears as its \uXXXX escape, as castor inspect shows it.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const visible = t => String(t).replace(HIDDEN, c => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
// At most n characters (whole code points: an emoji is never split), '…' when cut.
const cut = (t, n) => { const s = Array.from(t); return s.length <= n ? t : s.slice(0, n - 1).join('') + '…'; };
// An element whose text is `text` made visible and cut to `limit` characters (MAX_CELL unless
// given); cut, its tooltip holds more of it.
const $ = (tag, attrs = {}, text, limit = MAX_CELL) => { const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) { const whole = visible(text); el.textContent = cut(whole, limit);
    if (el.textContent !== whole) el.title = cut(whole, MAX_TITLE); }
  return el; };
// A duration as an operator reads it: under a minute in tenths of a second ("40.0 s"), then in
// minutes, hours and days ("12 min 05 s", "5 h 02 min", "2 d 3 h"), never thousands of seconds.
const secs = v => {
  if (typeof v !== 'number') return '-';
  if (!(Math.abs(v) >= 60)) return v.toFixed(1) + ' s';
  const t = Math.floor(Math.abs(v)), sign = v < 0 ? '-' : '', two = n => String(n).padStart(2, '0');
  if (t < 3600) return sign + Math.floor(t / 60) + ' min ' + two(t % 60) + ' s';
  if (t < 86400) return sign + Math.floor(t / 3600) + ' h ' + two(Math.floor(t % 3600 / 60)) + ' min';
  return sign + Math.floor(t / 86400) + ' d ' + Math.floor(t % 86400 / 3600) + ' h';
};
// A moment as its clock time, after its date (YYYY-MM-DD) when that is not today's: a cast stuck
// since yesterday must not read as one stuck since a time of today.
const clock = t => { const d = new Date(t), two = n => String(n).padStart(2, '0');
  const today = d.toDateString() === new Date().toDateString();
  return (today ? '' : d.getFullYear() + '-' + two(d.getMonth() + 1) + '-' + two(d.getDate()) + ' ') +
    d.toLocaleTimeString(); };
// What an activity is doing, for how long, and when the bound that ends it passes (if one does).
const doing = act => { const left = act.deadline_in_s;
  const bound = typeof left !== 'number' ? '' :
    left >= 0 ? ', deadline in ' + secs(left) : ', deadline passed ' + secs(-left) + ' ago';
  return act.text + ' for ' + secs(act.age_s) + bound; };
"""

_LIVE_JS = r"""
// The page's live stream. Each push is rendered; while none arrives (castor stopped, the network
// dropped, the server hangs) the page says since when it has had none and greys out what it shows,
// which is then no longer live. The page reconnects by itself, waiting RETRY_FIRST ms, then twice
// as long after each try that fails, up to RETRY_MAX (the browser's own retries, every half
// second while castor is down, each put a connection error in its log), and again RETRY_FIRST
// once a push came. A stream the console refuses (its answer is not a stream: castor serves again
// with another token, which ends the cookie the page had, or the cast's session closed) is asked
// once why, and the page says so and what to do.
let source = null, lastPush = 0, lostAt = 0, refusal = '', retryTimer = 0, dropTimer = 0;
let retryDelay = RETRY_FIRST;
// The status line changes at every push: it is no live region. What a screen reader is told
// (#announce, role=status) is only a change of the connection's state and of "needs attention".
// (what one push changed is said at once: the connection's state, then what joined or left)
let saying = [], connection = 'connecting';
function announce(text) { if (!saying.length) setTimeout(() => {
  document.getElementById('announce').textContent = saying.join('. '); saying = []; });
  saying.push(text); }
function connectionIs(state) { if (state === connection) return;
  connection = state; announce(state); }
function setStatus(text) { document.getElementById('status').textContent = text; }
function retryLater() { clearTimeout(retryTimer); retryTimer = setTimeout(connect, retryDelay);
  retryDelay = Math.min(retryDelay * 2, RETRY_MAX); }
function stale(why) {
  if (!lostAt) lostAt = Date.now();
  connectionIs(why);
  document.body.classList.add('stale');
  setStatus(why + ' since ' + clock(lostAt) + (lastPush ? '; what is shown is from ' + clock(lastPush) +
            ' and is not live' : ''));
}
async function whyRefused() {
  try {
    // (?probe: the console answers as it would the stream, 204 for a stream it would serve now,
    // and holds no stream slot for the question)
    const answer = await fetch(EVENTS_URL + '?probe', {cache: 'no-store', signal: AbortSignal.timeout(10000)});
    if (answer.ok) { connect(); return; }  // it serves again
    const said = (await answer.text()).split('\n')[0];
    if (answer.status >= 500) {  // too many streams, out of file descriptors: it may serve soon
      refusal = 'the console answered ' + answer.status + ': ' + visible(said) + '; retrying in 5 s';
      stale(refusal + ' —');
      retryTimer = setTimeout(connect, 5000);
      return;
    }
    refusal = answer.status === 401
      ? 'this page\'s access ended (castor serves with another token now): open the console again ' +
        'at the URL castor serve printed, with ?token=$(cat TOKEN_FILE)'
      : 'the console answered ' + answer.status + ': ' + visible(said);
    stale(refusal + ' —');
  } catch (err) {  // unreachable again: try later
    stale('disconnected: castor\'s console does not answer; retrying');
    retryLater();
  }
}
function connect() {
  clearTimeout(retryTimer);
  if (source) source.close();
  refusal = '';
  source = new EventSource(EVENTS_URL);
  source.onmessage = ev => {
    const pushed = JSON.parse(ev.data);
    // an error pushed instead of figures (the cast's session closed): what is shown stays the last
    // figures, which are no longer live
    if (pushed.error) { refusal = visible(pushed.error); stale(refusal + ' —'); return; }
    // (the page's own reading of a push: the figures it shows, or null when it cannot have them
    // from this push -- it missed one -- and a new stream, which starts whole, is asked for)
    let doc = null;
    try { doc = receive(pushed); } catch (err) { doc = null; }
    if (doc === null) { connect(); return; }
    lastPush = Date.now(); lostAt = 0; refusal = ''; document.body.classList.remove('stale');
    retryDelay = RETRY_FIRST; connectionIs('live');
    render(doc);
  };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) { whyRefused(); return; }
    source.close(); retryLater();  // the page reconnects, backing off (not the browser, every 0.5 s)
    // a stream the console ends on schedule (every 10 minutes) is back within a second, and is
    // not shown as a loss
    // (each failed retry errs again: the first error's timer stands)
    if (dropTimer) return;
    const at = lastPush, when = Date.now();
    dropTimer = setTimeout(() => { dropTimer = 0;
      if (lastPush === at) { lostAt = lostAt || when; stale('disconnected (reconnecting)'); } }, 1000);
  };
}
setInterval(() => { if (!refusal && !lostAt && lastPush && Date.now() - lastPush > STALE_AFTER * 1000)
  stale('no update'); }, 1000);
connect();
"""

_PATCHED_JS = APPLY_JS + r"""
// Each page's stream pushes the whole document first, then what changed since the version the page
// holds (see castor/console/delta.py): the page keeps the document it was told (its times as clock
// times) and shows it with its ages as of each push. A push from another version than the one it
// holds (it missed one) is not applied: the page asks for a new stream, which starts whole.
const AGES = new Set(ANCHORED_AGES), COUNTDOWNS = new Set(ANCHORED_COUNTDOWNS);
let held = null, heldVersion = null;
function receive(pushed) {
  if ('full' in pushed) held = pushed.full;
  else if (held !== null && pushed.base === heldVersion) held = applyPatch(held, pushed.patch);
  else return null;
  heldVersion = pushed.v;
  return unanchor(held, held.at);
}
"""

_TREE_JS = r"""
// How much of its restart limit the window holds now (as castor inspect says), '' while none.
function budget(a) { const b = a.restart_budget; if (!b || !b.restarts) return '';
  const used = b.restarts + '/' + b.max_restarts + ' restarts in ' + b.within_s + ' s';
  return b.applies_to === 'children' ? 'children: ' + used + ' before it fails' : used + ' before it is given up'; }
function bar(value, scale, cls) { const w = Math.min(120, Math.round(scale(value)));
  const b = $('span', {class: 'bar ' + cls, style: 'width:' + w + 'px'}); return b; }
// How a cast not running here stands, as its state file says: how it ended (its status, its
// failure's reason) and when; a cast that has not ended (another castor's, or one left when its
// castor stopped), its status as of its last save; a run directory castor cannot read, why.
const ENDED = new Set(['complete', 'failed', 'aborted']);
// A cast another runtime holds says which process: its pid and command line (as castor status says).
const heldBy = c => !c.held_by ? ''
  : ', held by pid ' + c.held_by.pid + (c.held_by.command ? ' (' + c.held_by.command + ')' : '');
// How long ago, as castor status says it: 12s, 3m 5s, 2h 4m.
const ago = s => { s = Math.max(0, Math.floor(s));
  return s < 60 ? s + 's' : s < 3600 ? Math.floor(s / 60) + 'm ' + s % 60 + 's'
                                     : Math.floor(s / 3600) + 'h ' + Math.floor(s % 3600 / 60) + 'm'; };
// The utility command a cast runs, its process found as castor status finds it: `cmd` (pid 42, for 3m 5s).
const commandWords = r => '`' + r.command + '` (pid ' + r.pid + ', for ' + ago(Date.now() / 1000 - r.started_at) + ')';
const commandOf = c => !c.command_running ? '' : !c.command_running.orphaned
  ? '; running its utility command ' + commandWords(c.command_running)
  : '; its utility command ' + commandWords(c.command_running) + ' still runs, left by the runtime that stopped';
const ended = c => c.status === 'unreadable' ? 'unreadable: ' + c.reason
  : (ENDED.has(c.status) ? 'ended ' + c.status : c.status + ', not running here' + heldBy(c) + commandOf(c)) +
    (c.reason ? ': ' + c.reason : '') + (ENDED.has(c.status) ? ' at ' : ', last saved at ') + clock(c.ended_at * 1000);
const castHref = (sid, cast) => BASE + 'cast/' + encodeURIComponent(sid) + '/' + encodeURIComponent(cast);
// Why an actor needs a look now and how long ago that began ([text, age in s or null]), or null
// (the rules are the docs' "needs attention").
function trouble(a) {
  const act = a.activity || {}; const box = a.mailbox || {}; const f = a.last_failure;
  if (a.retired_reason || a.state === 'retired') return ['retired: ' + (a.retired_reason || '-'), null];
  if (a.state === 'crashed') return ['crashed' + (f ? ': ' + f.error_type : ''), f ? f.age_s : null];
  if (typeof act.deadline_in_s === 'number' && act.deadline_in_s < 0) return [doing(act), act.age_s];
  const held = box.in_flight;  // a handler that does not return holds every message behind it
  if (held && held.since_s >= STUCK_AFTER)
    return [(act.kind && act.kind !== 'handling' ? doing(act) + '; ' : '') + 'handling ' + held.message_type +
            ' for ' + secs(held.since_s) + ' (its mailbox waits)', held.since_s];
  if (act.kind === 'handling' && act.age_s >= STUCK_AFTER) return [doing(act) + ' (its mailbox waits)', act.age_s];
  if ((box.oldest_age_s || 0) >= STUCK_AFTER)
    return [box.depth + ' queued, the oldest for ' + secs(box.oldest_age_s) + (act.text ? '; ' + doing(act) : ''),
            box.oldest_age_s];
  if (f && f.age_s <= RECENT_FAILURE)
    return ['failed: ' + f.error_type + ' ' + secs(f.age_s) + ' ago, restarts ' + a.restarts +
            (budget(a) ? ' (' + budget(a) + ')' : ''), f.age_s];
  return null;
}
function actorLink(a) {
  const parts = a.path.split('/');
  return a.kind === 'CastActor' && parts.length === 6 ? $('a', {href: castHref(parts[3], parts[5])}, a.path)
                                                      : $('span', {}, a.path);
}
// The element a keyboard user is on, found again after a redraw (a push every second replaced it).
function focusKey() { const el = document.activeElement;
  return el && el.tagName === 'A' && el.closest('.live') ? el.getAttribute('href') : null; }
function refocus(href) { if (href === null) return;
  const el = Array.from(document.querySelectorAll('.live a')).find(e => e.getAttribute('href') === href);
  if (el) el.focus({preventScroll: true}); }
let lastDoc = null;
// What "needs attention" listed at the last push: a screen reader is told what joined and how many left.
let listed = null;
function announceAttention(paths) {
  const now = new Set(paths);
  const joined = paths.filter(p => !(listed || new Set()).has(p));
  const left = listed ? Array.from(listed).filter(p => !now.has(p)).length : 0;
  listed = now;
  if (!joined.length && !left) return;
  announce('needs attention: ' + (joined.length ? joined.slice(0, 3).join(', ') +
           (joined.length > 3 ? ' and ' + (joined.length - 3) + ' more' : '') : '') +
           (left ? (joined.length ? '; ' : '') + left + ' no longer listed' : ''));
}
// Text the user is selecting in what the page shows (to copy a path): a redraw would drop it.
function selecting() { const sel = getSelection();
  const at = sel && !sel.isCollapsed && sel.anchorNode;
  return !!(at && (at.nodeType === 1 ? at : at.parentElement).closest('.live')); }
function render(doc) {
  lastDoc = doc;
  if (selecting()) {  // held still until the selection goes; the next push after it redraws
    setStatus('pushed ' + new Date(doc.at * 1000).toLocaleTimeString() + ' — held while text is selected');
    return;
  }
  const focused = focusKey();
  setStatus('updated ' + new Date(doc.at * 1000).toLocaleTimeString() + ' — ' + doc.actors.length + ' actors');
  const troubled = doc.actors.map(a => [a, trouble(a)]).filter(([, why]) => why);
  for (const w of doc.workers)
    if (w.crash_loop && w.crash_loop.state === 'given_up')
      troubled.push([{path: 'Icarus worker — ' + w.session_id, kind: ''}, ['crash loop: ' + w.crash_loop.text, null]]);
  for (const s of doc.sessions)
    if (s.casts_refused)
      troubled.push([{path: '/root/session/' + s.session_id, kind: ''},
                     ['saved casts not read: ' + s.casts_refused, null]]);
  for (const s of doc.sessions)
    for (const c of (s.ended || []).filter(c => c.attention))  // failed since the session opened
      troubled.push([{path: '/root/session/' + s.session_id + '/cast/' + c.cast_id, kind: 'CastActor'},
                     [ended(c), Math.max(0, doc.at - c.ended_at)]]);
  announceAttention(troubled.map(([a]) => a.path));
  const att = document.getElementById('attention'); att.replaceChildren();
  for (const [a, [why, age]] of troubled.slice(0, MAX_ATTENTION)) {
    const li = $('li', {'data-trouble': a.path});
    li.append(actorLink(a), $('span', {}, ' ' + why, MAX_REASON),
              $('span', {class: 'muted'}, typeof age === 'number' ? ' — since ' + clock((doc.at - age) * 1000) : ''));
    att.append(li);
  }
  if (troubled.length > MAX_ATTENTION)
    att.append($('li', {class: 'muted'}, (troubled.length - MAX_ATTENTION) + ' more (filter the tree below)'));
  if (!troubled.length) att.append($('li', {class: 'muted'}, 'nothing stuck or failing'));
  drawTree(doc);
  const sess = document.getElementById('sessions'); sess.replaceChildren();
  for (const s of doc.sessions.slice(0, MAX_CARDS)) {
    const card = $('div', {class: 'card', 'data-session': s.session_id});
    card.append($('b', {}, s.label || s.session_id), $('div', {class: 'muted'}, s.project || ''),
                $('div', {class: 'muted'}, s.session_id));
    const ul = $('ul');
    if (s.casts_refused)  // castor casts refuses the same: what it said, and nothing read from there
      ul.append($('li', {class: 'restarted', 'data-refused': ''}, 'saved casts not read: ' + s.casts_refused,
                  MAX_REASON));
    for (const c of s.casts.slice(0, MAX_CARD_CASTS)) {
      const li = $('li', {'data-cast': c.cast_id});
      li.append($('a', {href: castHref(s.session_id, c.cast_id)}, c.cast_id),
                $('span', {}, ' ' + (c.activity ? doing({text: c.activity, age_s: c.waiting_s,
                                                         deadline_in_s: c.deadline_in_s})
                                                : (c.phase || '-'))),
                // the command it runs, as castor status names it (a span of its own: the text before is cut)
                $('span', {'data-command': ''}, commandOf(c), MAX_REASON),
                // what would move it on (castor inspect casts says the same)
                $('span', {class: 'muted'}, c.waiting_for ? '; waits for ' + c.waiting_for : ''));
      ul.append(li);
    }
    for (const c of (s.ended || []).slice(0, MAX_CARD_ENDED)) {
      const li = $('li', {'data-ended': c.cast_id, class: c.status === 'failed' ? 'restarted' : 'muted'});
      li.append($('a', {href: castHref(s.session_id, c.cast_id)}, c.cast_id),
                $('span', {}, ' ' + ended(c), MAX_REASON));
      ul.append(li);
    }
    if (s.casts.length > MAX_CARD_CASTS)
      ul.append($('li', {class: 'muted'}, (s.casts.length - MAX_CARD_CASTS) + ' more casts (filter the tree below)'));
    if (!s.casts.length) ul.append($('li', {class: 'muted'}, 'no casts running'));
    // every cast of its project, a page at a time (castor casts lists the same)
    if (s.casts_total) {
      const all = $('li', {class: 'muted'});
      all.append($('a', {href: BASE + 'casts/' + encodeURIComponent(s.session_id), 'data-all-casts': ''},
                   'all ' + s.casts_total + ' casts of its project'));
      ul.append(all);
    }
    card.append(ul); sess.append(card);
  }
  if (doc.sessions.length > MAX_CARDS)
    sess.append($('div', {class: 'muted', 'data-more': 'sessions'},
                  (doc.sessions.length - MAX_CARDS) + ' more sessions (filter the tree below)'));
  const wk = document.getElementById('workers'); wk.replaceChildren();
  const off = []; let cards = 0;
  for (const w of doc.workers) {
    if (w.state !== 'active') { off.push(w.session_id); continue; }
    if (++cards > MAX_CARDS) continue;
    const p = w.process || {}; const wa = w.actor || {};
    const given = !!(w.crash_loop && w.crash_loop.state === 'given_up');
    const card = $('div', {class: 'card', 'data-worker': w.session_id});
    card.append($('b', {}, 'Icarus worker — ' + w.session_id),
      $('div', {}, 'workers started ' + w.workers_started +
                   (p.alive ? ', pid ' + p.pid + ' (alive)'
                            : (p.pid ? ', last pid ' + p.pid : ', pid -') + ' (none running)')),
      $('div', {}, 'calls ' + (p.calls ?? 0) + ', RSS ' +
                   (p.rss_bytes ? Math.round(p.rss_bytes / 1048576) + ' MiB' : '-') +
                   ', CPU ' + (p.cpu_user_s !== undefined ? (p.cpu_user_s + p.cpu_system_s).toFixed(2) + ' s' : '-')),
      $('div', {}, 'mailbox depth ' + ((wa.mailbox || {}).depth ?? '-') + ', restarts ' + (wa.restarts ?? 0) + ', ' +
                   (wa.retired_reason ? 'retired: ' + wa.retired_reason +
                      (given ? '' : ' (the next call starts a fresh worker)')
                    : !wa.activity ? '-' : wa.activity.kind === 'idle' ? 'idle ' + secs(wa.activity.age_s)
                                                                       : doing(wa.activity))));
    const waiting = (wa.mailbox || {}).queued || [];
    if (waiting.length)
      card.append($('div', {'data-queued': String(waiting.length)}, 'queued: ' + waiting.map(q => {
        const d = q.detail || {};
        return (d.target || d.hook || q.message_type) + ' (waited ' + secs(q.age_s) +
               (typeof d.deadline_in_s === 'number' ? ', deadline in ' + secs(d.deadline_in_s) : '') + ')';
      }).join(', ')));
    if (w.crash_loop && w.crash_loop.text)
      card.append($('div', given ? {class: 'restarted', 'data-crash-loop': 'given_up'} : {},
                    'crash loop: ' + w.crash_loop.text));
    wk.append(card);
  }
  if (cards > MAX_CARDS)
    wk.append($('div', {class: 'muted', 'data-more': 'workers'}, (cards - MAX_CARDS) + ' more Icarus workers'));
  if (off.length) wk.append($('div', {class: 'muted'}, 'no Icarus backend configured for: ' +
                                                       off.slice(0, MAX_CARDS).join(', ') +
                                                       (off.length > MAX_CARDS ? ' and ' + (off.length - MAX_CARDS) +
                                                                                 ' more' : '')));
  if (!doc.workers.length) wk.append($('div', {class: 'muted'}, 'no Icarus workers'));
  refocus(focused);
}
// The tree: the actors the filter matches (path, kind, state or what it does), the first MAX_ROWS
// of them drawn; the line under it says how many there are.
function drawTree(doc) {
  const words = document.getElementById('filter').value.trim().toLowerCase();
  const body = document.getElementById('tree'); body.replaceChildren();
  let matched = 0;
  for (const a of doc.actors) {
    const act = a.activity || {};
    // a retired actor does nothing: why it retired is what it says (castor inspect says the same)
    const what = a.retired_reason ? 'retired: ' + a.retired_reason
               : act.kind && act.kind !== 'idle' ? doing(act)
               : (act.kind === 'idle' ? 'idle ' + secs(act.age_s) : '-');
    if (words && ![a.path, a.kind, a.state, what].some(t => String(t).toLowerCase().includes(words))) continue;
    if (++matched > MAX_ROWS) continue;
    const depthLevel = a.path.split('/').length - 2;
    const tr = $('tr', {'data-path': a.path, 'data-kind': a.kind});
    const name = $('td', {class: 'name', style: 'padding-left:' + (8 + depthLevel * 16) + 'px'});
    const parts = a.path.split('/');
    const last = parts[parts.length - 1];
    if (a.kind === 'CastActor' && parts.length === 6) name.append($('a', {href: castHref(parts[3], parts[5])}, last));
    else name.append($('span', {}, last));
    tr.append(name, $('td', {}, a.kind), $('td', {class: 'state-' + a.state}, a.state + ' #' + a.incarnation));
    const d = $('td', {class: 'depth'}); d.append(bar(a.mailbox.depth, v => v * 4, 'depth'),
      document.createTextNode(String(a.mailbox.depth))); tr.append(d);
    const o = $('td', {class: 'oldest'}); const age = a.mailbox.oldest_age_s;
    o.append(bar(age || 0, v => v > 0 ? 12 * Math.log2(1 + v * 10) : 0, 'age'), document.createTextNode(secs(age)));
    tr.append(o);
    tr.append($('td', {class: 'activity' + (act.kind === 'idle' ? ' muted' : '')}, what));
    tr.append($('td', {class: 'restarts' + (a.restarts ? ' restarted' : '')}, String(a.restarts)));
    tr.append($('td', {class: 'budget muted'}, budget(a)));
    const f = a.last_failure;
    tr.append($('td', {class: 'failure'}, f ? f.error_type + ' ' + secs(f.age_s) + ' ago' : '-'));
    const labels = a.labels || {};
    tr.append($('td', {class: 'muted'}, labels.label ? labels.label + ' — ' + labels.project : ''));
    body.append(tr);
  }
  document.getElementById('shown').textContent = matched > MAX_ROWS
    ? 'showing ' + MAX_ROWS + ' of ' + matched + ' actors' + (words ? ' that match' : '') +
      ': type in the filter to narrow them'
    : (words ? matched + ' of ' + doc.actors.length + ' actors match' : '');
}
document.getElementById('filter').addEventListener('input', () => { if (lastDoc) drawTree(lastDoc); });
"""

_CAST_JS = r"""
function render(doc) {
  document.getElementById('graph').innerHTML = doc.svg;  // server-built SVG, every text escaped
  const facts = document.getElementById('facts'); facts.replaceChildren();
  const act = ((doc.actor || {}).activity || {});
  for (const [k, v] of [['phase', doc.phase], ['socket', doc.current_socket], ['item', doc.item],
                        ['doing', act.text ? doing(act) : '-'],
                        ['request', doc.request], ['run dir', doc.run_dir], ['failed', doc.failed_reason],
                        ['tokens', doc.usage.tokens], ['cost (USD)', doc.usage.cost_usd], ['turns', doc.usage.turns]]) {
    // a request, a run dir, a failure reason: whole (the server cuts a request to 500), wrapped
    const tr = $('tr'); tr.append($('th', {}, k), $('td', {class: 'long'}, v === null || v === undefined ? '-'
                                                                                : String(v), MAX_TITLE));
    facts.append(tr);
  }
  const feed = document.getElementById('feed'); feed.replaceChildren();
  for (const e of doc.events.slice().reverse()) {
    const tr = $('tr'); tr.append($('td', {}, e.ts ? clock(e.ts) : '-'),
                                  $('td', {}, e.type), $('td', {class: 'muted long'}, e.data, MAX_TITLE));
    feed.append(tr);
  }
  setStatus('updated ' + new Date(doc.at * 1000).toLocaleTimeString());
}
"""


_HERE_JS = """
// Shown at this page's own address under BASE: a `?token=` leaves the address bar (and this
// history entry), and a reload carries the cookie, which the browser sends under BASE alone.
if (location.pathname + location.search !== HERE) history.replaceState(null, '', HERE);
"""

#: No icon: the browser asks for /favicon.ico otherwise, outside the console's path, where no
#: cookie goes (a 401 in the browser's log on every page).
_HEAD = '<meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">' \
        '<link rel="icon" href="data:,">'


def _page_script(base: str, here: str, events_url: str) -> str:
    """The constants a page's script starts with: its console's BASE (every link and stream of it
    lives there), the address it is shown at, its stream, and the page's bounds."""
    constants = {"BASE": base, "HERE": base + here, "EVENTS_URL": events_url, "MAX_ROWS": MAX_TREE_ROWS,
                 "MAX_ATTENTION": MAX_ATTENTION, "MAX_CELL": MAX_CELL_CHARS, "MAX_TITLE": MAX_TITLE_CHARS,
                 "MAX_CARD_CASTS": MAX_CARD_CASTS, "MAX_CARDS": MAX_CARDS, "MAX_CARD_ENDED": MAX_CARD_ENDED,
                 "MAX_REASON": MAX_REASON_CHARS, "STUCK_AFTER": STUCK_AFTER_S,
                 "RECENT_FAILURE": RECENT_FAILURE_S, "STALE_AFTER": STALE_AFTER_S,
                 "RETRY_FIRST": RETRY_FIRST_MS, "RETRY_MAX": RETRY_MAX_MS,
                 "ANCHORED_AGES": sorted(AGES), "ANCHORED_COUNTDOWNS": sorted(COUNTDOWNS)}
    declared = "".join(f"const {name} = {json.dumps(value)};" for name, value in constants.items())
    return f"{declared}{_HERE_JS}".replace("</", "<\\/")


def tree_page(base: str = "/") -> str:
    """The main page; ``base`` is the path its console serves it under (see ``ConsoleServer.base``)."""
    return f"""<!doctype html><html><head>{_HEAD}<title>castor console</title>
<style>{_STYLE}</style></head><body>
<h1>castor console</h1><div id="status">connecting…</div>{_ANNOUNCER}
<h2>needs attention</h2><ul id="attention" class="live"></ul>
<h2>sessions and casts</h2><div id="sessions" class="cards live"></div>
<h2>Icarus workers</h2><div id="workers" class="cards live"></div>
<h2>actors</h2>
<p><label>filter <input id="filter" type="search" placeholder="path, kind, state or activity"></label>
<span id="shown" class="muted"></span></p>
<div class="scroll live"><table><thead><tr><th>actor</th><th>kind</th><th>state</th><th>depth</th>
<th>oldest message</th><th>doing now</th><th>restarts</th><th>restart limit</th><th>last failure</th><th></th></tr>
</thead><tbody id="tree"></tbody></table></div>
<p class="muted"><a href="{html.escape(base)}metrics">/metrics</a> (Prometheus)</p>
<script>{_page_script(base, "", base + "events")}{_COMMON_JS}{_PATCHED_JS}{_TREE_JS}{_LIVE_JS}</script></body></html>"""


def cast_page(runtime: Any, sid: str, cast_id: str, base: str = "/") -> str:
    first = cast_data(runtime, sid, cast_id)  # not_found before any page is sent
    events_url = f"{base}events/cast/{sid}/{cast_id}"
    e = html.escape
    return f"""<!doctype html><html><head>{_HEAD}<title>cast {e(cast_id)}</title>
<style>{_STYLE}</style></head><body>
<h1>cast {e(cast_id)}</h1><div><a href="{e(base)}">← all actors</a> · session {e(sid)} ·
<span id="status">connecting…</span></div>{_ANNOUNCER}
<h2>loadout</h2><div id="graph" class="scroll live">{first["svg"]}</div>
<h2>now</h2><div class="scroll live"><table id="facts"></table></div>
<h2>events (newest first)</h2><div class="scroll live"><table><tbody id="feed"></tbody></table></div>
<script>{_page_script(base, f"cast/{sid}/{cast_id}", events_url)}{_COMMON_JS}{_PATCHED_JS}{_CAST_JS}{_LIVE_JS}</script>
</body></html>"""


def casts_page(runtime: Any, sid: str, base: str = "/", cursor: str | None = None) -> str:
    """Every cast of session ``sid``'s project, :data:`CASTS_PAGE` at a time (newest id first, then
    the run directories castor cannot read, as ``castor casts`` lists them; ``cursor``: where the
    previous page ended, ``invalid_params`` when it is no cursor), each with its status, socket,
    last save and failure's reason, linked to its page. Not live: the listing as it is when asked.
    ``not_found`` once the session closed; ``forbidden`` when its artifact root leads out of its
    project."""
    from urllib.parse import quote

    try:
        runtime.session(sid)
    except NotFound:
        raise NotFound(f"no open session {sid}", data={"session_id": sid, "reason": "session_closed"}) from None
    root = artifact_root(runtime, sid)
    page = list_page(root, limit=CASTS_PAGE, cursor=cursor)
    e = visible_html
    rows = []
    for cast in page.casts:
        href = f"{base}cast/{quote(sid, safe='')}/{quote(cast.cast_id, safe='')}"
        rows.append(f'<tr data-cast="{e(cast.cast_id)}"><td><a href="{html.escape(href)}">{e(cast.cast_id)}</a></td>'
                    f'<td class="state-{e(cast.status)}">{e(cast.status)}</td><td>{e(cast.current_socket or "-")}</td>'
                    f'<td>{e(cast.updated_at)}</td>'
                    f'<td class="long">{e(str(cast.failed_reason or "")[:MAX_REASON_CHARS])}</td>'
                    f'<td class="long muted">{e(str(cast.request or "")[:MAX_CELL_CHARS])}</td></tr>')
    for problem in page.problems:
        rows.append(f'<tr data-cast="{e(problem.cast_id)}"><td>{e(problem.cast_id)}</td><td>unreadable</td>'
                    f'<td>{e(problem.current_socket or "-")}</td><td>-</td>'
                    f'<td class="long">{e(str(problem.reason)[:MAX_REASON_CHARS])}</td><td></td></tr>')
    here = f"{base}casts/{quote(sid, safe='')}"
    more = (f'<p><a data-next href="{html.escape(here + "?cursor=" + quote(page.next_cursor, safe=""))}">'
            f'the next {CASTS_PAGE}</a></p>' if page.next_cursor else "")
    return f"""<!doctype html><html><head>{_HEAD}<title>casts of session {e(sid)}</title>
<style>{_STYLE}</style></head><body>
<h1>casts of session {e(sid)}</h1><div><a href="{html.escape(base)}">← all actors</a> · {page.total} casts under
{e(str(root))}, newest first (as <code>castor casts</code> lists them){" · from " + e(cursor) if cursor else ""}</div>
<div class="scroll"><table><thead><tr><th>cast</th><th>status</th><th>socket</th><th>last saved</th>
<th>failed</th><th>request</th></tr></thead><tbody id="casts">{"".join(rows)}</tbody></table></div>{more}
</body></html>"""
