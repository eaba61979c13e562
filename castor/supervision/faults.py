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

from castor.supervision.fault_plan import FaultKind, FaultPlan, kill_process_trees
from castor.supervision.handle import ActorHandle


def kill(handle: ActorHandle, reason: str = "killed by fault injection") -> None:
    handle.kill(reason)


def crash_next(handle: ActorHandle, message_type: str | None = None) -> None:
    handle.faults.add(FaultKind.CRASH, message_type)


def delay_next(handle: ActorHandle, seconds: float, message_type: str | None = None) -> None:
    handle.faults.add(FaultKind.DELAY, message_type, seconds)


def kill_process(handle: ActorHandle) -> list[int]:
    return handle.kill_process()


__all__ = ["FaultKind", "FaultPlan", "crash_next", "delay_next", "kill", "kill_process", "kill_process_trees"]
