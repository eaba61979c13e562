"""The pending one-shot faults of one actor, and the process-tree kill they share.

Below the handle (each handle owns a :class:`FaultPlan`) and the actor (which kills its
owned process trees with :func:`kill_process_trees`); the operator-facing functions that
take a handle are in :mod:`castor.supervision.faults`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import StrEnum

import psutil

from castor.supervision.kinds import InjectedCrash


class FaultKind(StrEnum):
    """A one-shot fault a plan holds until the message it targets arrives."""

    CRASH = "crash"
    DELAY = "delay"


class FaultPlan:
    """Pending one-shot faults of one actor, consumed by its loop in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[tuple[FaultKind, str | None, float]] = []
        self.pending = False  # read without the lock on the hot path; a stale read only delays one message

    def add(self, kind: FaultKind, message_type: str | None = None, seconds: float = 0.0) -> None:
        with self._lock:
            self._faults.append((FaultKind(kind), message_type, seconds))
            self.pending = True

    def apply_before(self, message_type: str, on_delay: Callable[[float | None, str], None] | None = None) -> None:
        """Run on the actor thread before a message of ``message_type`` is handled. ``on_delay``
        is told a delay's seconds as it begins and ``None`` once it is over (snapshots say so)."""
        with self._lock:
            for index, (kind, wanted, seconds) in enumerate(self._faults):  # noqa: B007 - kind and seconds are read after the break
                if wanted is None or wanted == message_type:
                    del self._faults[index]
                    self.pending = bool(self._faults)
                    break
            else:
                return
        if kind is FaultKind.DELAY:
            if on_delay is not None:
                on_delay(seconds, message_type)
            try:
                time.sleep(seconds)  # the delay *is* the fault
            finally:
                if on_delay is not None:
                    on_delay(None, message_type)
        elif kind is FaultKind.CRASH:
            raise InjectedCrash(f"injected crash before {message_type}")


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
                proc.kill()  # psutil's: refuses a pid that another process has taken since
            except psutil.Error:
                pass
