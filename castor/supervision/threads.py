"""Reusable daemon threads for actor loops, and the registry of every other thread castor starts.

Starting an OS thread per incarnation (pykka's way) costs more than the
rest of a short-lived actor's life. :class:`LoopThreads` keeps a few
finished loop threads *parked* and hands the next incarnation's loop to one
of them instead.

Guarantees:

* **Same as a fresh thread, to the loop.** Every loop runs in a fresh, empty
  :class:`contextvars.Context` (what a new thread starts with), on a daemon
  thread named after the actor class.
* **Nothing kept alive.** A parked thread holds no reference to the loop it
  ran (the task, its context and any exception are dropped before parking),
  so a dead actor is collectable as soon as its handle lets go of it.
* **Bounded.** At most ``max_parked`` threads wait; a thread that finds the
  park full, or waits ``idle_seconds`` unclaimed, ends.
* **Fork-safe.** A forked child forgets the parent's parked threads (they do
  not exist in the child) and starts fresh ones.

Failure behaviour: a loop that raises (castor's loop never should) is logged
and the thread parks as usual; nothing is re-run.

A thread castor starts for anything but an actor loop (a stream reader, a watchdog, a timer) is
started with :func:`start_thread`: it is named, says which actor (or component) it works for
and why, and is listed in the tree snapshot (``threads``) while it runs, so ``castor inspect``
and ``ops.actors`` show everything that runs. The registry holds no thread past its end.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading
import time
import weakref
from typing import Any, Callable

from castor._log import logger

DEFAULT_MAX_PARKED = 64
"""Parked threads kept at most (each costs an OS thread's stack, mostly unused)."""
DEFAULT_IDLE_SECONDS = 30.0
"""A parked thread unclaimed for this long ends."""

_names = itertools.count(1)


class _Worker:
    """One pooled thread's mailbox: a gate it parks on and the task handed to it."""

    __slots__ = ("gate", "task", "thread")

    def __init__(self, task: Callable[[], None]) -> None:
        self.gate = threading.Lock()
        self.gate.acquire()  # held while parked; released once to hand over a task
        self.task: Callable[[], None] | None = task
        self.thread: threading.Thread | None = None


class LoopThreads:
    """A park of idle daemon threads that run one actor loop at a time."""

    def __init__(self, *, max_parked: int = DEFAULT_MAX_PARKED, idle_seconds: float = DEFAULT_IDLE_SECONDS) -> None:
        self.max_parked = max_parked
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._parked: list[_Worker] = []
        me = weakref.ref(self)  # the fork hook must not keep a discarded park alive
        os.register_at_fork(after_in_child=lambda: _forget_parked(me()))

    def run(self, task: Callable[[], None], name: str) -> None:
        """Run ``task`` on a parked thread, or on a new daemon thread when none is parked."""
        with self._lock:
            worker = self._parked.pop() if self._parked else None
        label = f"{name}-{next(_names)}"
        if worker is None:
            worker = _Worker(task)
            thread = threading.Thread(target=self._serve, args=(worker,), name=label, daemon=True)
            worker.thread = thread
            thread.start()
            return
        worker.task = task
        if worker.thread is not None:
            worker.thread.name = label  # for stack dumps: which actor this thread now runs
        worker.gate.release()

    @property
    def parked(self) -> int:
        return len(self._parked)

    def _serve(self, worker: _Worker) -> None:
        while True:
            task, worker.task = worker.task, None
            if task is not None:
                try:
                    contextvars.Context().run(task)
                except BaseException as exc:  # noqa: BLE001 - keep the thread; the loop owns its failures
                    logger.opt(exception=exc).error("actor loop raised past its own handling")
                    del exc
                task = None  # park without a reference to the finished loop (and its actor)
            if not self._park(worker):
                return

    def _park(self, worker: _Worker) -> bool:
        """Wait for the next task; False when this thread should end instead."""
        with self._lock:
            if len(self._parked) >= self.max_parked:
                return False
            self._parked.append(worker)
        if worker.gate.acquire(timeout=self.idle_seconds):
            return True
        with self._lock:
            if worker in self._parked:  # unclaimed: end, and never be handed a task
                self._parked.remove(worker)
                return False
        worker.gate.acquire()  # claimed while the wait timed out: its task is being handed over
        return True

    def forget_parked(self) -> None:
        """In a forked child: drop the parent's parked threads (they do not exist here)."""
        self._lock = threading.Lock()
        self._parked = []


def _forget_parked(park: LoopThreads | None) -> None:
    if park is not None:
        park.forget_parked()


LOOP_THREADS = LoopThreads()
"""The process's shared park of actor-loop threads."""


_running_lock = threading.Lock()
_running: dict[int, tuple[threading.Thread, str, str, float]] = {}  # serial -> (thread, owner, purpose, since)
_serials = itertools.count(1)


def start_thread(target: Callable[..., Any], *, name: str, owner: str, purpose: str, args: tuple[Any, ...] = (),
                 kwargs: dict[str, Any] | None = None, daemon: bool = True) -> threading.Thread:
    """Start a named thread that the tree snapshot lists (under ``owner``) until ``target`` returns."""
    serial = next(_serials)

    def run() -> None:
        try:
            target(*args, **(kwargs or {}))
        finally:
            with _running_lock:
                _running.pop(serial, None)

    thread = threading.Thread(target=run, name=name, daemon=daemon)
    with _running_lock:
        _running[serial] = (thread, owner, purpose, time.monotonic())
    try:
        thread.start()
    except BaseException:
        with _running_lock:
            _running.pop(serial, None)
        raise
    return thread


def running_threads(prefix: str = "") -> list[dict[str, Any]]:
    """The registered threads still running whose owner is ``prefix`` or under it (all when empty),
    as ``ThreadSnapshot`` data, by owner then name."""
    now = time.monotonic()
    with _running_lock:
        rows = list(_running.values())
    wanted = prefix.rstrip("/")
    return sorted(({"name": thread.name, "owner": owner, "purpose": purpose, "age_s": max(0.0, now - since),
                    "daemon": thread.daemon}
                   for thread, owner, purpose, since in rows
                   if not wanted or owner == wanted or owner.startswith(wanted + "/")),
                  key=lambda row: (row["owner"], row["name"]))
