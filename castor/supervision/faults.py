"""Fault injection: first-class, deterministic, for tests and operators.

=====================  ==================================================  ====================================
fault                  effect                                              how to use
=====================  ==================================================  ====================================
kill                   owned processes die now; the actor crashes at its   ``kill(handle)``
                       next message boundary (control lane, ahead of
                       queued messages); supervisor applies its policy
crash_next             the next message (optionally of one type) raises    ``crash_next(handle, "cast.step")``
                       :class:`InjectedCrash` instead of being handled
delay_next             the next message (optionally of one type) waits     ``delay_next(handle, 0.5)``
                       ``seconds`` on the actor thread before handling
kill_process           SIGKILL to every process tree the actor owns; the   ``kill_process(handle)``
                       actor notices through its own IO (e.g. a worker
                       reports ``worker_crashed``)
=====================  ==================================================  ====================================

Over the endpoint these are reachable only when the runtime was started with
``--allow-faults`` (see ``ops.fault``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from castor.supervision.handle import ActorHandle


class FaultPlan:
    """Pending one-shot faults of one actor, consumed by its loop in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[tuple[str, str | None, float]] = []
        self.pending = False  # read without the lock on the hot path; a stale read only delays one message

    def add(self, kind: str, message_type: str | None = None, seconds: float = 0.0) -> None:
        with self._lock:
            self._faults.append((kind, message_type, seconds))
            self.pending = True

    def apply_before(self, message_type: str) -> None:
        """Run on the actor thread before a message of ``message_type`` is handled."""
        with self._lock:
            for index, (kind, wanted, seconds) in enumerate(self._faults):
                if wanted is None or wanted == message_type:
                    del self._faults[index]
                    self.pending = bool(self._faults)
                    break
            else:
                return
        if kind == "delay":
            time.sleep(seconds)  # the delay *is* the fault
        elif kind == "crash":
            from castor.supervision.actor import InjectedCrash

            raise InjectedCrash(f"injected crash before {message_type}")


def kill(handle: ActorHandle, reason: str = "killed by fault injection") -> None:
    handle.kill(reason)


def crash_next(handle: ActorHandle, message_type: str | None = None) -> None:
    handle.faults.add("crash", message_type)


def delay_next(handle: ActorHandle, seconds: float, message_type: str | None = None) -> None:
    handle.faults.add("delay", message_type, seconds)


def kill_process(handle: ActorHandle) -> list[int]:
    return handle.kill_process()


def kill_process_trees(pids: list[int]) -> None:
    """SIGKILL each pid and all its descendants; already-gone processes are fine."""
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            victims = parent.children(recursive=True) + [parent]
        except psutil.NoSuchProcess:
            continue
        for proc in victims:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
