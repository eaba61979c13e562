"""``castor abort`` of a cast another runtime holds: the request it leaves in the cast's run
directory, and how the runtime that holds the cast finds and judges it.

``castor abort ID`` cannot reach the process that runs the cast (a ``castor cast`` in another
terminal, a harness's ``castor serve``, any runtime a harness embeds); it leaves
``<runDir>/abort.request`` (:data:`ABORT_REQUEST`, ``{requested_at, pid}``) and waits. Every
runtime watches the casts it holds (:func:`watch`): one thread per process stats each watched
request path once per :data:`ABORT_POLL_S`, so one holding N casts makes N ``lstat`` calls a tick
and a cast's transitions do no work for it. A runtime holding no cast polls nothing: the thread
keeps its tick, *parked* (it looks only whether a cast is watched), so a start hands its cast over
by adding it to the watched set -- no thread started and none woken, the start's only hand-over
is its cast's own loop thread -- and the thread ends after :data:`WATCHER_IDLE_S` without one.

| found at ``abort.request`` | what the holder does |
|---|---|
| nothing | nothing (one ``lstat``) |
| a regular file whose ``requested_at`` falls between the moment this runtime took the cast (``since``) and now (plus :data:`ABORT_REQUEST_CLOCK_SKEW_S`) | moved aside (:data:`ABORT_REQUEST_TAKEN`), read, removed; the cast is asked to abort |
| one left from before (a killed ``castor abort``'s), with no readable time, a time to come, a link, a FIFO, an empty directory | removed, named in one warning; never applied |
| something that cannot be removed (a directory with something in it, a read-only run directory) | named once and left |

The request is moved aside before it is judged, so the holder removes only what it read: a new
``castor abort`` replacing a stale request at that moment is either taken whole (and applied) or
left in place for the next poll -- never removed unread with the stale one.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import itertools
import json
import os
import stat
import threading
import time
from collections.abc import Callable

from castor._log import logger
from castor.adapters.fs import read_regular_file

ABORT_REQUEST = "abort.request"
#: Where the holder moves the request it is about to judge (see the module doc).
ABORT_REQUEST_TAKEN = "abort.request.taken"
#: How far ahead of this machine's clock a request's ``requested_at`` may be and still be taken
#: (a ``castor abort`` on another host sharing the storage); one further ahead was never written
#: while this runtime held the cast.
ABORT_REQUEST_CLOCK_SKEW_S = 60.0
#: How often a holder looks for a request (``castor abort`` waits 5 s for it to be taken).
ABORT_POLL_S = 0.1
#: How long the watcher thread ticks, parked, with no cast watched before it ends.
WATCHER_IDLE_S = 30.0


def requested_at(request: str | os.PathLike[str]) -> float | None:
    """When an abort request was written (its ``requested_at``); None if unreadable. A FIFO, a
    device or a file over 64 KiB is refused at once (never waited on); a link is never followed."""
    try:
        value = json.loads(read_regular_file(request, 64 * 1024, follow_links=False)).get("requested_at")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class AbortRequests:
    """What the holder of one cast finds at its run directory's ``abort.request`` on each poll.

    Only a request made while the holder has the cast -- a regular file whose ``requested_at``
    falls between ``since`` (taken before the holder took the cast) and now -- asks it to abort;
    it is removed as taken. Anything else there is never applied, whoever put it there (a project
    checkout can carry one): it is removed and named in one warning (``warn``); what cannot be
    removed is named once and left (see the module doc)."""

    def __init__(self, request: str | os.PathLike[str], since: float, warn: Callable[[str], None]) -> None:
        self.request = os.fspath(request)  # a text: a watch costs a start no pathlib object
        self.since = since
        self.warn = warn
        self._left: tuple[int, int, int] | None = None  # what was named and left (device, inode, mtime)

    def asked(self) -> bool:
        """True once per request made while the holder has the cast; one ``lstat`` when none is there."""
        try:
            found = os.lstat(self.request)
        except OSError:
            return False
        if self._left == (found.st_dev, found.st_ino, found.st_mtime_ns):
            return False
        if stat.S_ISDIR(found.st_mode):  # never castor's; rmdir removes no request written since
            return self._not_applied(None, lambda: os.rmdir(self.request), found)
        taken = f"{os.path.dirname(self.request)}/{ABORT_REQUEST_TAKEN}"
        try:
            os.rename(self.request, taken)
        except FileNotFoundError:
            return False  # gone meanwhile (the abort that wrote it gave up)
        except OSError:  # it cannot be moved aside (a read-only run directory): judged where it is, and left
            asked_at = requested_at(self.request)
            self._left = (found.st_dev, found.st_ino, found.st_mtime_ns)  # applied or named once
            if self._applies(asked_at):
                return True
            return self._not_applied(asked_at, None, found)
        asked_at = requested_at(taken)
        if self._applies(asked_at):
            _remove_quietly(taken)
            return True
        return self._not_applied(asked_at, lambda: os.unlink(taken), found)

    def _applies(self, asked_at: float | None) -> bool:
        return asked_at is not None and self.since <= asked_at <= time.time() + ABORT_REQUEST_CLOCK_SKEW_S

    def _not_applied(self, asked_at: float | None, remove: Callable[[], None] | None, found: os.stat_result) -> bool:
        why = ("was left from before this runtime took the cast" if asked_at is not None and asked_at < self.since
               else "is not one castor wrote while this runtime holds the cast")
        if remove is not None:
            try:
                remove()
            except OSError:
                pass
            else:
                self.warn(f"abort request {self.request} {why}: removed, not applied")
                return False
        self._left = (found.st_dev, found.st_ino, found.st_mtime_ns)
        self.warn(f"abort request {self.request} {why}: not applied, and castor cannot remove it (remove it)")
        return False


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Watch:
    """The process's one watcher thread: started with the first watched cast, it polls every
    watched cast once per :data:`ABORT_POLL_S`; with none it *parks* -- keeps its tick, polling
    nothing -- and ends once it has been parked ``idle_s``. A start right after another cast ended
    (a session's casts one after another) so hands its cast to the parked thread by adding it to
    :attr:`watched`, which the next tick reads: no thread is started, and none is woken mid-start
    (a woken watcher took the GIL from the starting thread at its next system call, on the other
    CPU unpinned). A request is still taken within one poll interval of the watch's first tick,
    as a new thread's first poll was."""

    def __init__(self, idle_s: float = WATCHER_IDLE_S) -> None:
        self.idle_s = idle_s
        self.lock = threading.Lock()
        self.watched: dict[int, tuple[AbortRequests, Callable[[], None]]] = {}
        self.keys = itertools.count()
        self.running = False
        self.parked = False  # the thread ticks with nothing watched (polls nothing)

    def add(self, requests: AbortRequests, on_asked: Callable[[], None]) -> Callable[[], None]:
        with self.lock:
            key = next(self.keys)
            self.watched[key] = (requests, on_asked)
            start = not self.running
            self.running = True
        if start:
            # Imported here: the commands that only read casts (castor casts, status) load this
            # module with the storage and must not load the actor runtime (its first watch does).
            from castor.supervision.threads import start_thread

            try:
                start_thread(self.run, name="castor-abort-requests", owner="/runtime",
                             purpose="takes castor abort's requests for the casts this process holds")
            except RuntimeError:  # no thread to be had (the interpreter shuts down): nothing is watched
                with self.lock:
                    self.running = False

        def unwatch() -> None:
            with self.lock:
                self.watched.pop(key, None)

        return unwatch

    def run(self) -> None:
        while self._next_tick():
            self._poll()

    def _next_tick(self) -> bool:
        """Wait for the next tick with a cast watched (parked, ticking, while none is); False: the
        thread has been parked ``idle_s`` and ends (the next watch starts a new one)."""
        parked_since: float | None = None
        while True:
            time.sleep(ABORT_POLL_S)
            with self.lock:
                if self.watched:
                    self.parked = False
                    return True
                now = time.monotonic()
                if parked_since is None:
                    parked_since = now
                    self.parked = True
                elif now - parked_since >= self.idle_s:
                    self.parked = False
                    self.running = False  # under the lock: a watch added from now on starts a thread
                    return False

    def _poll(self) -> None:
        """One look at every watched cast's request. Its references to the casts (their callbacks,
        and through them their actors' handles) end with it: a parked thread keeps no cast alive."""
        with self.lock:
            now = list(self.watched.values())
        for requests, on_asked in now:
            try:
                if requests.asked():
                    on_asked()
            except Exception as exc:  # noqa: BLE001 - one cast's fault never stops the others' watch
                logger.warning("looking for an abort request at {path} failed: {exc}", path=requests.request,
                               exc=exc)


_WATCH = _Watch()


def _forget_at_fork() -> None:
    """In a forked child: the parent's watcher thread is not there, nor are its casts."""
    global _WATCH
    _WATCH = _Watch()


os.register_at_fork(after_in_child=_forget_at_fork)


def watch(run_dir: str | os.PathLike[str], since: float, on_asked: Callable[[], None],
          warn: Callable[[str], None]) -> Callable[[], None]:
    """Look for ``castor abort``'s request in ``run_dir`` every :data:`ABORT_POLL_S` until the
    returned function is called (idempotent). ``on_asked`` is called (on the watcher thread) once
    per request made since ``since``; ``warn`` names anything else found there, which is never
    applied. Both must return at once (a tell to the holder, never a wait)."""
    return _WATCH.add(AbortRequests(f"{os.fspath(run_dir)}/{ABORT_REQUEST}", since, warn), on_asked)


__all__ = ["ABORT_POLL_S", "ABORT_REQUEST", "ABORT_REQUEST_CLOCK_SKEW_S", "ABORT_REQUEST_TAKEN", "WATCHER_IDLE_S",
           "AbortRequests", "requested_at", "watch"]
