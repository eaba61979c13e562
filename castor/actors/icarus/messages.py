"""The messages the Icarus session actors exchange (all local: none ever crosses a process).

=====================  ==================  ===========================================================
message                handled by          reply
=====================  ==================  ===========================================================
``HarnessEvent``       HookController      none (the result goes to the message's ``reply`` future)
``Feedback``           HookController      none (a worker, filter or abort completion)
``SetHooksEnabled``    HookController      the new ``enabled`` flag
``SetContextVisible``  HookController      the new ``visible`` flag
``HookStatus``         HookController      ``HookStatusReply``
``Classify``           ClassifierActor     ``Classified``
``AuditAndRelease``    AuditActor          ``Released``
``WorkerCall``         IcarusWorkerActor   the backend function's value (or a typed error)
``WorkerInspect``      IcarusWorkerActor   the worker process's stats (None before the first call)
=====================  ==================  ===========================================================

``WorkerCall`` and ``WorkerInspect`` are defined in :mod:`castor.actors.icarus.worker`, beside
the client's allocation-light constructor for ``WorkerCall`` (which must set exactly the fields
the model declares); they are re-exported here so every Icarus message is found in one place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from enum import StrEnum
from typing import Any

from castor.actors.icarus.worker import WorkerCall, WorkerInspect
from castor.domain.icarus import lifecycle as lc
from castor.domain.icarus.classify import FilterResult
from castor.messages.base import LocalMessage
from castor.supervision import CancelToken

# ---------------------------------------------------------------------------
# HookController


class HarnessEventName(StrEnum):
    """The harness lifecycle events Icarus takes part in (their wire names); any other event
    name is not forwarded to the HookController."""

    SESSION_START = "session_start"
    BEFORE_AGENT_START = "before_agent_start"
    AGENT_END = "agent_end"
    AGENT_SETTLED = "agent_settled"
    SESSION_SHUTDOWN = "session_shutdown"
    CONTEXT = "context"


class CallerRun:
    """A one-shot hand-over of one worker call from the HookController to the thread that asked.

    The controller offers the call with :meth:`offer` (a callable that makes it and reports its outcome)
    while it handles the asker's :class:`HarnessEvent`; the asker takes it with :meth:`take` once the ask
    returned or failed. ``take`` closes the slot, so an offer that comes later (an ask that timed
    out while the controller was still handling it) fails and the controller queues the call on
    its worker lane instead: the call is made exactly once, by exactly one thread.
    """

    __slots__ = ("request", "_lock", "_closed", "_call")

    def __init__(self, request: str) -> None:
        self.request = request
        self._lock = threading.Lock()
        self._closed = False
        self._call: Callable[[], None] | None = None

    def offer(self, call: Callable[[], None]) -> bool:
        """Hand ``call`` to the asker; ``False`` when the asker has stopped waiting for one."""
        with self._lock:
            if self._closed or self._call is not None:
                return False
            self._call = call
            return True

    def take(self) -> Callable[[], None] | None:
        """Close the slot; the call offered before, if any (the taker must run it)."""
        with self._lock:
            self._closed = True
            call, self._call = self._call, None
            return call


class HarnessEvent(LocalMessage, type_name="icarus.hooks.event"):
    """A harness lifecycle event; ``reply`` receives the result (or None).

    With ``run_here`` the asking thread offers to make the event's worker call itself (see
    :class:`CallerRun` and ``HookController``): the controller hands it over only when its
    worker lane is idle, so the call keeps its place in the lane's order.
    """

    event: lc.HarnessLifecycleEvent  # carries the request id its answer goes to
    reply: Future[Any]  # receives the machine's answer for the harness (or None)
    current_model: tuple[str, str] | None = None
    run_here: CallerRun | None = None


class Feedback(LocalMessage, type_name="icarus.hooks.feedback"):
    """A completion fed back into the machine (WorkerDone, FilterDone, TurnAborted)."""

    event: lc.WorkerDone | lc.FilterDone | lc.TurnAborted


class SetHooksEnabled(LocalMessage, type_name="icarus.hooks.set_enabled"):
    enabled: bool | None = None  # None toggles


class SetContextVisible(LocalMessage, type_name="icarus.hooks.set_visible"):
    visible: bool | None = None  # None toggles


class HookStatus(LocalMessage, type_name="icarus.hooks.status"):
    pass


class HookStatusReply(LocalMessage, type_name="icarus.hooks.status_reply"):
    enabled: bool
    visible: bool
    generation: int
    session_id: str
    in_flight: int


# ---------------------------------------------------------------------------
# ClassifierActor


class Classify(LocalMessage, type_name="icarus.classifier.classify"):
    context: str
    prompt: str
    deadline: float  # absolute time.monotonic()
    cancel: CancelToken | None = None  # the turn's abort (or an interrupt) cancels the classification
    current_model: tuple[str, str] | None = None


class Classified(LocalMessage, type_name="icarus.classifier.classified"):
    result: FilterResult | None  # None: classifier "none", pass through
    duration_ms: int
    notices: tuple[str, ...] = ()


# ---------------------------------------------------------------------------
# AuditActor


class AuditAndRelease(LocalMessage, type_name="icarus.audit.release"):
    original: str
    result: FilterResult | None
    duration_ms: int | None = None


class Released(LocalMessage, type_name="icarus.audit.released"):
    text: str | None  # None: inject nothing
    persisted: bool  # an audit entry was acknowledged
    warned: bool  # filtered text was withheld because the audit failed


__all__ = [
    "AuditAndRelease", "Classified", "Classify", "Feedback", "HarnessEvent", "HarnessEventName", "HookStatus",
    "HookStatusReply",
    "Released", "SetContextVisible", "SetHooksEnabled", "WorkerCall", "WorkerInspect",
]
