"""The messages the Icarus session actors exchange (all local: none ever crosses a process).

=====================  ==================  ===========================================================
message                handled by          reply
=====================  ==================  ===========================================================
``HarnessEvent``       HookController      none (the result goes to the message's ``reply`` Answer)
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
from _thread import LockType, allocate_lock
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from castor._log import logger
from castor.actors.icarus.worker import WorkerCall, WorkerInspect
from castor.domain.icarus import lifecycle as lc
from castor.domain.icarus.classify import FilterResult
from castor.messages.base import LocalMessage
from castor.messages.built import NEW, SET_DICT, SET_EXTRA, SET_FIELDS_SET, SET_PRIVATE
from castor.supervision import CancelToken

# ---------------------------------------------------------------------------
# HookController

#: Makes the first set of an Answer win; uncontended in practice. Taken with ``with``, not the
#: cheaper ``acquire()`` + ``try``/``finally``: an answer is read (and may be set) on a caller's
#: thread, the main thread among them, where a signal handler's exception can land between
#: ``acquire()`` and the ``try`` and leave the guard held (tests/endpoint/test_lock_sections.py).
_ANSWER_GUARD = threading.Lock()


class Answer:
    """Where a harness event's answer goes: set once (the first ``set_result`` wins, later ones are
    ignored), read with a deadline by any number of threads, and handed to at most one callback on
    whichever thread sets it.

    What a hook call needs of ``concurrent.futures.Future`` and no more: a Future builds a
    ``Condition`` (an RLock and a waiter list) and takes it, in Python code, at every ``done``,
    ``set_result``, ``add_done_callback`` and ``result`` -- eight times per hook call. This is one
    short guard section per outcome, and a pre-acquired lock as the gate (as the actors' reply
    slots are) made only for a reader that has to wait: the commonest reader comes once the answer
    is set, and does not. It carries no exception: the hook controller answers ``None`` when it
    cannot answer.

    ``callback``: the one callback, given when it is known at the start (``add_done_callback``
    then takes none): no guard section of its own.
    """

    __slots__ = ("_gate", "_done", "_value", "_callback")

    def __init__(self, callback: Callable[[Any], None] | None = None) -> None:
        self._gate: LockType | None = None  # made by the first reader that waits (result)
        self._done = False
        self._value: Any = None
        self._callback = callback

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> bool:
        """Answer with ``value``; ``False`` (and nothing changes) when answered already. The
        callback, if any, runs here, on this thread; its failure is logged, never raised."""
        with _ANSWER_GUARD:
            if self._done:
                return False
            self._value = value
            self._done = True
            callback, gate = self._callback, self._gate
        if gate is not None:
            gate.release()  # a waiting reader passes (and releases it for the next)
        if callback is not None:
            try:  # _run_callback, inline (every hook call with an early answer passes here)
                callback(value)
            except Exception:  # noqa: BLE001 - the answer stands; the callback's failure is its own
                logger.exception("a hook answer's callback failed")
        return True

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(value)`` once answered: now, on this thread, when answered already. One only."""
        with _ANSWER_GUARD:
            if not self._done:
                if self._callback is not None:
                    raise RuntimeError("an Answer takes one callback")
                self._callback = fn
                return
        _run_callback(fn, self._value)

    def result(self, timeout: float | None = None) -> Any:
        """The answer; waits up to ``timeout`` seconds (``None``: no limit) and raises
        ``TimeoutError`` when none came."""
        if not self._done:
            with _ANSWER_GUARD:
                done, gate = self._done, self._gate
                if not done and gate is None:
                    gate = self._gate = allocate_lock()
                    gate.acquire()  # set_result releases it (it reads _gate under the guard)
            if gate is not None and not done:
                if not gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                    raise TimeoutError("no answer in time")
                gate.release()  # the next waiter passes at once
        return self._value


def _run_callback(fn: Callable[[Any], None], value: Any) -> None:
    try:
        fn(value)
    except Exception:  # noqa: BLE001 - the answer stands; the callback's failure is its own
        logger.exception("a hook answer's callback failed")



class HarnessEventName(StrEnum):
    """The harness lifecycle events Icarus takes part in (their wire names); any other event
    name is not forwarded to the HookController."""

    SESSION_START = "session_start"
    BEFORE_AGENT_START = "before_agent_start"
    AGENT_END = "agent_end"
    AGENT_SETTLED = "agent_settled"
    SESSION_SHUTDOWN = "session_shutdown"
    CONTEXT = "context"


# The members under module names, for the hook call's path: a member read off the class
# (``HarnessEventName.BEFORE_AGENT_START``) goes through the enum's metaclass, about 1k instructions
# a read on Python 3.11, and a hook call made six of them (the session's mapping and bound, the
# controller's event). The same objects: ``SESSION_START is HarnessEventName.SESSION_START``.
SESSION_START = HarnessEventName.SESSION_START
BEFORE_AGENT_START = HarnessEventName.BEFORE_AGENT_START
AGENT_END = HarnessEventName.AGENT_END
AGENT_SETTLED = HarnessEventName.AGENT_SETTLED
SESSION_SHUTDOWN = HarnessEventName.SESSION_SHUTDOWN
CONTEXT = HarnessEventName.CONTEXT


class HarnessEvent(LocalMessage, type_name="icarus.hooks.event"):
    """A harness lifecycle event; ``reply`` receives the result (or None)."""

    event: lc.HarnessLifecycleEvent  # carries the request id its answer goes to
    reply: Answer  # receives the machine's answer for the harness (or None)
    current_model: tuple[str, str] | None = None
    #: The thread id of an asker that will make the worker calls itself (``WorkerLane.help_until``):
    #: handled on that very thread (inline), the event's calls do not wake the lane's thread, and
    #: the answer is the lane to help. None: the lane's thread makes them, as ever.
    helper: int | None = None

    def queued_detail(self, now: float) -> dict[str, str | int | float | bool | None]:
        """The hook it is (``before_agent_start``...), never its prompt or messages."""
        return {"hook": self.event.kind}


class Feedback(LocalMessage, type_name="icarus.hooks.feedback"):
    """A completion fed back into the machine (WorkerDone, FilterDone, TurnAborted)."""

    event: lc.WorkerDone | lc.FilterDone | lc.TurnAborted

    def queued_detail(self, now: float) -> dict[str, str | int | float | bool | None]:
        """Which completion it is, and for a worker call whether it failed (its code only)."""
        detail: dict[str, str | int | float | bool | None] = {"completion": self.event.kind}
        if isinstance(self.event, lc.WorkerDone) and not self.event.ok:
            detail["error_code"] = self.event.error_code
        return detail


def harness_event(event: lc.HarnessLifecycleEvent, reply: Answer, current_model: tuple[str, str] | None,
                  helper: int | None) -> HarnessEvent:
    """A ``HarnessEvent`` from values castor has just built with its field types (the hook call's
    hot path: the lifecycle event, a fresh ``Answer``, a (provider, id) pair of strings or None, a
    thread id or None), built, not validated: validation would only check what the caller made, in
    a union of six event models (1.3 against 0.4 us); a test pins it equal to the validated message.
    What the harness sent is validated before: by the endpoint's params model and
    :func:`castor.actors.icarus.hook_controller.event_from_harness`."""
    # ``built(HarnessEvent, ...)`` spelled out, as ``castor.actors.icarus.worker`` builds its call:
    # the state ``built`` sets (every field given, in declaration order), without its keyword
    # packing, defaults merge and fields-set copy.
    message = NEW(HarnessEvent)
    SET_DICT(message, {"event": event, "reply": reply, "current_model": current_model, "helper": helper})
    SET_FIELDS_SET(message, set(_HARNESS_EVENT_FIELDS))
    SET_EXTRA(message, None)
    SET_PRIVATE(message, None)
    return message


def feedback(event: lc.WorkerDone | lc.FilterDone | lc.TurnAborted) -> Feedback:
    """``Feedback(event=event)`` for a completion castor built itself (see :func:`harness_event`)."""
    message = NEW(Feedback)  # built(Feedback, event=event), spelled out (see harness_event)
    SET_DICT(message, {"event": event})
    SET_FIELDS_SET(message, {"event"})
    SET_EXTRA(message, None)
    SET_PRIVATE(message, None)
    return message


_HARNESS_EVENT_FIELDS = frozenset(("event", "reply", "current_model", "helper"))


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
