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

import threading

from castor.messages.errors import InvalidParams
from castor.supervision.fault_plan import FaultKind, FaultPlan, kill_process_trees
from castor.supervision.handle import ActorHandle


def kill(handle: ActorHandle, reason: str = "killed by fault injection") -> bool:
    """Crash ``handle``'s running incarnation at its next boundary; False (nothing injected) when
    none runs."""
    return handle.kill(reason)


def crash_next(handle: ActorHandle, message_type: str | None = None) -> None:
    handle.faults.add(FaultKind.CRASH, message_type)


def delay_next(handle: ActorHandle, seconds: float, message_type: str | None = None) -> None:
    """Hold the next message (of ``message_type``) ``seconds`` on the actor's thread. ``seconds``
    that are negative, NaN or past ``threading.TIMEOUT_MAX`` are refused ``invalid_params`` here:
    they would crash the actor when its message came, not delay it."""
    if not 0 <= seconds <= threading.TIMEOUT_MAX:  # NaN fails this too
        raise InvalidParams(f"delay_next needs 0 <= seconds <= {threading.TIMEOUT_MAX:.0f}, not {seconds!r}",
                            data={"seconds": repr(seconds)})
    handle.faults.add(FaultKind.DELAY, message_type, seconds)


def kill_process(handle: ActorHandle) -> list[int]:
    return handle.kill_process()


__all__ = ["FaultKind", "FaultPlan", "crash_next", "delay_next", "kill", "kill_process", "kill_process_trees"]
