"""HookController: the per-session actor that runs the Icarus hook lifecycle.

It interprets the effects of the pure machine :mod:`castor.domain.icarus.lifecycle`
(the decision table lives there and in docs/icarus.md "Hook lifecycle"):

=================  ===========================================================================
effect             interpretation
=================  ===========================================================================
CallWorker         queued on the session's *worker lane*, which submits calls to
                   :class:`~castor.ports.worker.WorkerCalls` one at a time, in order, on its
                   own thread or on a helping asker's (see "Hand-offs"); the outcome comes
                   back to this actor as ``WorkerDone``, asked from that thread (so an idle
                   controller handles it there), or stepped there without a message when
                   its only effect is the caller's answer (see "Completions")
CloseWorker        queued on the same lane, so it runs after ``on_session_end``; the replies
                   that follow it in the same step are given only once the worker is closed
Filter             a filter job thread: ``ClassifierActor`` (one total deadline, honours the
                   request's :class:`CancelToken`) then ``AuditActor`` (persist before
                   release); the released text comes back as ``FilterDone``
CancelFilter       cancels that request's token (wakes the classifier wait at once)
SendMessage,       the :class:`~castor.ports.session.SessionUiPort`; errors swallowed. A
SetStatus          ``before_agent_start``'s footer that repeats the footer the previous
                   ``before_agent_start`` sent is not sent again (see "The footer" below)
Reply              resolves the caller's future for that request (exactly once)
Log                loguru, codes only (never context or error text)
=================  ===========================================================================

Guarantees
----------
* The actor never blocks on the worker, the classifier or the harness: all
  waiting happens on the lane (its thread, or a helping asker's) and on job
  threads, so ``/icarus off``, a new ``session_start`` or a turn abort is
  handled while a retrieval is in flight (that is what makes the
  session-generation rules observable).
* Worker-lane failure policy: when a call fails with ``timeout``,
  ``worker_retired``, ``worker_crashed`` or ``cancelled``, every call still
  queued on the lane is failed *without being sent*, so queued mutations never
  run later on a fresh worker. Queued ``close`` requests still run.
* Ambient failure policy: every harness event gets ``None`` or its
  injection, never an error, even when the worker, classifier or audit fail;
  a classifier-or-audit actor failure releases the original context.
* On any exit of an incarnation every unanswered caller gets ``None`` and
  every filter is cancelled. A restarted incarnation starts from the initial
  state (first turn armed, nothing pending) and ignores late completions.

The footer
----------
The lifecycle sets the footer at every prompt (``SetStatus`` in each ``before_agent_start``
step). The controller sends it to the UI port only when it says something new: a prompt's
footer is skipped when the last status this incarnation sent was the same ``(key, text)``, sent
by a prompt's step, and nothing reset it since. Reset (the next prompt sends its footer again):
any other status sent (``session_start``'s footer, ``/icarus off``/``on``, the shutdown's
clear), every ``session_start`` (also one the lifecycle answers as a repeat, sending nothing),
a UI call that failed, and a new incarnation (it starts with nothing sent). What resets it on
the harness's side reaches castor as one of these or as a new session: a reconnect, a replaced
session or a respawned runtime opens a new session, with a new controller. So the harness sees
the footer of every state change and the first prompt after each, and no notification per
prompt saying what it already shows.

Hand-offs
---------
Because the handlers never block, the controller takes asks inline (``inline_asks``): a
harness event that finds it idle is handled on the asking thread, and the lane's ``WorkerDone``
is stepped on the thread that made the worker call ("Completions") or *asked* from it, so the
caller's future is resolved on that thread.

Completions
-----------
The machine's state is stepped and replaced under a small lock (``_step_lock``), not only in the
actor's turn. A worker call's completion whose step has one effect, its caller's answer (a
prompt with nothing to inject -- the commonest --, one whose context is injected unfiltered, a
start without context, a capture), is stepped and answered on the thread that made the call,
under that lock, without a message to the actor: one inline ask fewer per hook. Any other
completion (a failed call, whose step logs; a context to filter or to send; a shutdown's close)
is stepped in the turn as before, and so is everything else. The lock makes each step atomic, so
a completion and a concurrent ``/icarus off``, new session or abort are applied one after the
other in some order, each answering what the other left in flight: as when both were messages.
The completion is still applied before the lane counts as free again and before the caller's
answer is set, so nothing the harness sends after that answer is stepped ahead of it.

A prompt's own step
-------------------
The commonest prompt (hooks on, a string prompt that is not blank, not custom-triggered: the
lifecycle's ``prompt_step`` decides it, the retrieval's call and the footer) is not a message
either, when the controller is idle: the client (``HookClient.event``, given the session's
:class:`PromptDoor`) calls the running incarnation's ``step_prompt`` on its own thread, which claims
the mailbox as an inline ask does (``Mailbox.claim_idle``: the loop parked on an empty, open
mailbox, the handle's turn free; the claim holds that turn, and whatever is sent meanwhile queues
behind it), steps and replaces the state under ``_step_lock``, registers the caller's answer, sends
the footer when it is news and queues the call, then gives the claim back (``end_inline``). No
envelope, reply slot, dispatch or message: one inline ask fewer a hook, so a hook over the
endpoint asks the controller nothing at all. Everything else takes the ask as before: a message
queued or a handler running (the claim fails: the prompt queues behind them, in the order of
arrival), an incarnation ending, a fault planned for the next message, a prompt the general
machine decides (off, blank, custom, a non-string prompt), and a step that raises -- nothing was
changed, and the ask steps it again in the turn, where a raise is a crash as for any handler. An
interrupt landing after the state was replaced (Ctrl-C's ``KeyboardInterrupt`` on the main thread)
crashes the incarnation (``ActorKilled``: restarted, its snapshot shows it, ``on_terminate``
answers the caller) and goes on. Registered before the claim is given back, the prompt is found
by an ``/icarus off``, a new session or an abort handled after it, which answer it at once.

Who makes the worker call: the lane's own thread, unless the asker offers to (``HookClient.event``
with ``answer=``, which the endpoint gives: its early answer). Then the event is stepped on the
asking thread without waking the lane's thread, and the asker runs the queued call itself while
no other call runs (``WorkerLane.help_until``): a hook over the endpoint crosses no thread at
all. A waiting caller must still be answered at once by an ``/icarus off``, a new session or an
abort while its retrieval is in flight -- and the asking thread is then inside that retrieval. So
the answer does not go through it: the caller's future calls ``answer`` on whichever thread
settles it (the one handling the ``/icarus off``), and the endpoint writes the response from
there, before the asking thread's handler returns (``Context.early_answer``). Without ``answer``
(a direct caller) the lane's thread makes the call and the caller waits on the future, as ever.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Container
from functools import partial
from typing import Any, ClassVar

from castor.actors.icarus.audit import DEFAULT_AUDIT_TIMEOUT
from castor.actors.icarus.messages import (
    AGENT_END,
    AGENT_SETTLED,
    BEFORE_AGENT_START,
    CONTEXT,
    SESSION_SHUTDOWN,
    SESSION_START,
    Answer,
    AuditAndRelease,
    Classified,
    Classify,
    Feedback,
    HarnessEvent,
    HarnessEventName,
    HookStatus,
    HookStatusReply,
    Released,
    SetContextVisible,
    SetHooksEnabled,
    feedback,
    harness_event,
)
from castor.domain.icarus import lifecycle as lc
from castor.messages.errors import CastorError, ErrorCode, InvalidParams, Timeout
from castor.ports.session import SessionUiPort
from castor.ports.worker import WorkerCalls
from castor.supervision import Actor, ActorHandle, CancelToken, handles
from castor.supervision.threads import start_thread
from castor.supervision.timers import call_later

#: Error codes after which the worker's queued calls must not be sent.
LANE_FATAL_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.WORKER_RETIRED, ErrorCode.WORKER_CRASHED,
                              ErrorCode.CANCELLED, ErrorCode.ACTOR_RETIRED})
#: Extra seconds an internal ask may take beyond its own budget.
ASK_GRACE = 1.0
#: How long a session's end waits for a retrieval still running on the worker that holds the
#: session's state (most end well within it) before it is stopped so a quit does not wait for it.
QUIT_GRACE_S = 1.0


# ---------------------------------------------------------------------------
# Harness payload -> lifecycle event

HARNESS_EVENTS = tuple(HarnessEventName)


def event_from_harness(name: str, payload: dict[str, Any], request: str) -> lc.HarnessLifecycleEvent:
    """Validate a ``harness.event`` and build the lifecycle event. Raises :class:`InvalidParams`."""
    if not isinstance(payload, dict):
        raise InvalidParams("event payload must be a map", data={"reason": "bad_payload"})
    if name == SESSION_START:
        sid = payload.get("session_id", "")
        return lc.SessionStart(request=request, session_id=sid if isinstance(sid, str) else "")
    if name == BEFORE_AGENT_START:
        return lc.BeforeAgentStart.build(request=request, prompt=payload.get("prompt"),  # every prompt: build
                                         custom=bool(payload.get("custom", False)))
    if name in (AGENT_END, AGENT_SETTLED):
        messages = payload.get("messages") or ()
        if not isinstance(messages, (list, tuple)):
            raise InvalidParams("messages must be a list", data={"reason": "bad_messages"})
        if name == AGENT_END:
            return lc.AgentEnd(request=request, messages=tuple(messages))
        return lc.AgentSettled(request=request, aborted=bool(payload.get("aborted", False)),
                               messages=tuple(messages))
    if name == SESSION_SHUTDOWN:
        return lc.SessionShutdown(request=request)
    if name == CONTEXT:
        return lc.ContextEvent(request=request)
    raise InvalidParams(f"unknown harness event {name!r}", data={"reason": "unknown_event",
                                                                  "known": [str(e) for e in HARNESS_EVENTS]})


def _current_model(payload: dict[str, Any]) -> tuple[str, str] | None:
    model = payload.get("model") if isinstance(payload, dict) else None
    if isinstance(model, dict) and isinstance(model.get("provider"), str) and isinstance(model.get("id"), str):
        return model["provider"], model["id"]
    return None


# ---------------------------------------------------------------------------
# The worker lane


class _Close:
    """A queued close; ``finish`` runs its continuation exactly once."""

    def __init__(self, then: Callable[[], None] | None) -> None:
        self._then = then

    def finish(self) -> None:
        then, self._then = self._then, None
        if then is not None:
            then()


class WorkerLane:
    """Runs worker calls one at a time, in order: on its own daemon thread, or on the thread of a
    caller that helps (:meth:`help_until`) while no call runs.

    Guarantees: one job at a time, in the order submitted, whichever thread runs it; a job is
    run once; the failure policy (a fatal error fails every queued call unsent) holds for both;
    a job nobody helps with is run by the lane's thread (woken, or started, for it)."""

    def __init__(self, worker: WorkerCalls, timeout: float, feedback: Callable[[lc.WorkerDone], None], *,
                 owner: str = "/icarus") -> None:
        self._owner = owner
        self._worker = worker
        self._timeout = timeout
        self._feedback = feedback
        # ``_mutex`` (a C-level lock) for plain critical sections; ``_cond`` (the same lock) to
        # wait and notify -- Condition.__enter__ is Python code. Sections are ``with`` sections (a
        # helping asker may be the main thread: tests/endpoint/test_lock_sections.py), about 1.7k
        # instructions each, so the helped path takes as few as it can (see help_until).
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        # An item is a call (request, function, kwargs) or a close callback.
        self._queue: deque[Any] = deque()
        self._stopped = False
        self._running = False  # a job runs (on the lane's thread or a helper's)
        self._thread: threading.Thread | None = None
        self._current: tuple[str, CancelToken] | None = None  # the running call's function and token
        #: When the running call's deadline passes (monotonic; its worker is killed then), for
        #: snapshots; None between calls. One assignment each way: read without the lock.
        self.current_deadline: float | None = None
        self._abandoned: CancelToken | None = None  # the token abandon_running fired

    @property
    def queued(self) -> int:
        """How many jobs wait behind the running one (for snapshots: one read, no lock)."""
        return len(self._queue)

    def submit(self, request: str, function: str, kwargs: dict[str, Any], *, wake: bool = True) -> None:
        """Queue a call. ``wake=False``: the caller's own thread is about to :meth:`help_until`
        (waking the lane's thread would only have it take the job first, a hand-off)."""
        with self._mutex:
            if not self._stopped:
                self._queue.append((request, function, kwargs))
                if wake:
                    self._wake_locked()

    def submit_close(self, then: Callable[[], None] | None = None, *, wake: bool = True) -> None:
        """Close the worker after every call queued before; then run ``then``."""
        self._put(_Close(then), wake)

    def stop(self) -> None:
        """Stop after the current call; calls still queued are failed without being sent."""
        with self._mutex:
            self._stopped = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for item in dropped:
            if isinstance(item, _Close):
                item.finish()
            else:
                self._safe_feedback(lc.WorkerDone(request=item[0], ok=False, error_code="actor_stopped"))

    def running(self, function: str) -> CancelToken | None:
        """The token of the running call if it is a call of ``function``, else None."""
        with self._mutex:
            current = self._current
            return current[1] if current is not None and current[0] == function else None

    def abandon_running(self, function: str, only: CancelToken | None = None) -> bool:
        """Cancel the running call if it is a call of ``function`` (and, given ``only``, that very
        call) whose answer nobody waits for any more (a retrieval the session's shutdown answered
        already): its worker is stopped and the calls queued behind it run at once on a fresh
        one, instead of after it. True if one was cancelled."""
        with self._mutex:
            current = self._current
            if current is None or current[0] != function or (only is not None and current[1] is not only):
                return False
            self._abandoned = current[1]
        current[1].cancel()
        return True

    def drop_answered(self, function: str, in_flight: Container[str]) -> None:
        """Take the queued calls of ``function`` whose request is not ``in_flight`` (its asker was
        answered already: an invalidation, an abort) off the queue: never sent, and no
        completion fed back (the lifecycle has nothing left to settle for them)."""
        with self._mutex:
            if not self._queue:
                return
            self._queue = deque(item for item in self._queue
                                if isinstance(item, _Close) or item[1] != function or item[0] in in_flight)

    def help_until(self, done: Answer, deadline: float) -> None:
        """Run queued jobs on this thread, in order, while no other thread runs one, until ``done``
        is done (or ``deadline``, a ``time.monotonic()`` instant, passes); then leave what is left
        to the lane's thread."""
        mutex = self._mutex
        # ``with`` sections, not ``acquire()`` + ``try``: this runs on the asker's thread, which may be
        # the main one (tests/endpoint/test_lock_sections.py says why that matters). One section
        # before the first job and one after each: a job's release (``_running``), the choice of the
        # next and the wake-up of the lane's thread for what is left, together.
        more = not done.done() and time.monotonic() < deadline
        with mutex:
            if self._stopped or self._running or not self._queue:
                return
            if not more:
                self._wake_locked()
                return
            item = self._queue.popleft()
            token = self._take_locked(item)
        while True:
            try:
                self._run_taken(item, token)
            except BaseException:
                with mutex:
                    self._running = False
                    if self._queue and not self._stopped:
                        self._wake_locked()
                raise
            more = not done.done() and time.monotonic() < deadline
            with mutex:
                self._running = False
                if self._stopped or not self._queue:
                    return
                if not more:
                    self._wake_locked()  # what is left goes to the lane's thread
                    return
                item = self._queue.popleft()
                token = self._take_locked(item)

    def _put(self, item: Any, wake: bool) -> None:
        with self._mutex:
            if self._stopped:
                if isinstance(item, _Close):
                    item.finish()
                return
            self._queue.append(item)
            if wake:
                self._wake_locked()

    def _wake_locked(self) -> None:
        if self._thread is None:
            self._thread = start_thread(self._run, name="icarus-hook-lane", owner=self._owner,
                                        purpose="submit the hook controller's worker calls in order")
        self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while (not self._queue or self._running) and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                item = self._queue.popleft()
                token = self._take_locked(item)
            try:
                self._run_taken(item, token)
            finally:
                with self._mutex:
                    self._running = False

    def _take_locked(self, item: Any) -> CancelToken | None:
        """Mark ``item``, just taken off the queue, as running (caller holds the mutex): for a call,
        its token is made and published as the running call's in the same critical section."""
        self._running = True
        if type(item) is _Close:
            return None
        token = CancelToken()
        self._current = (item[1], token)
        return token

    def _run_taken(self, item: Any, token: CancelToken | None) -> None:
        """Run a job this thread took off the queue (``_take_locked``); no one else runs one meanwhile.
        The caller clears ``_running`` (under the mutex) once this returns or raises.

        A call's completion is fed back before the lane counts as free again, so a call the
        feedback queues never starts ahead of it."""
        if token is None:
            self._close()
            item.finish()
            return
        request, function, kwargs = item
        self.current_deadline = time.monotonic() + self._timeout  # the worker client's own bound
        try:
            result = self._worker.call("hooks", function, None, kwargs, self._timeout, token)
            done = lc.WorkerDone.build(request=request, ok=True, result=result)  # every call: build
        except CastorError as exc:
            reason = exc.data.get("reason")
            done = lc.WorkerDone(request=request, ok=False, error_code=str(exc.code),
                                 error_reason=reason if reason == "crash_loop" else None)
        except Exception:  # noqa: BLE001 - ambient: an error is an omitted step
            done = lc.WorkerDone(request=request, ok=False, error_code="internal")
        finally:
            self.current_deadline = None
            with self._mutex:
                self._current = None
                abandoned, self._abandoned = self._abandoned is token, None
        # A call the lane abandoned itself (abandon_running) stopped its worker on purpose: the
        # calls behind it are what it was abandoned for, and run on a fresh worker.
        if not done.ok and done.error_code in LANE_FATAL_CODES and not abandoned:
            self._fail_queued()
        try:  # _safe_feedback, inline (every hook call passes here)
            self._feedback(done)
        except CastorError:
            pass  # the controller is gone; its callers were answered on exit

    def _fail_queued(self) -> None:
        with self._mutex:
            failed = [item for item in self._queue if not isinstance(item, _Close)]
            kept = [item for item in self._queue if isinstance(item, _Close)]
            self._queue = deque(kept)
        for request, _, _ in failed:
            self._safe_feedback(lc.WorkerDone(request=request, ok=False, error_code="worker_retired"))

    def _close(self) -> None:
        try:
            self._worker.close()
        except Exception:  # noqa: BLE001 - closing must never fail the shutdown
            pass

    def _safe_feedback(self, done: lc.WorkerDone) -> None:
        try:
            self._feedback(done)
        except CastorError:
            pass  # the controller is gone; its callers were answered on exit


# ---------------------------------------------------------------------------
# The prompt's own step, without an ask

#: What :meth:`HookController.step_prompt` returns when it did not take the prompt (the ask does).
NOT_TAKEN: Any = object()


class PromptDoor:
    """Where a :class:`HookClient` finds the running controller incarnation's
    :meth:`~HookController.step_prompt`: set by the incarnation's ``on_start``, cleared by its
    ``on_terminate``; None between two incarnations (the ask path then). One per session, shared
    by the session's client and every incarnation of its controller ("A prompt's own step")."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step: Callable[[lc.BeforeAgentStart, Answer, tuple[str, str] | None, bool], Any] | None = None


# ---------------------------------------------------------------------------
# The actor


class HookController(Actor):
    #: Its handlers never block (every wait is on the lane or a filter job), so an ask that
    #: finds it idle is handled on the asking thread: no thread hand-off ("Hand-offs" above).
    inline_asks: ClassVar[bool] = True

    def __init__(
        self,
        config: lc.HookConfig,
        *,
        worker: WorkerCalls,
        ui: SessionUiPort,
        classifier: ActorHandle | None = None,
        audit: ActorHandle | None = None,
        worker_timeout: float = 30.0,
        classifier_timeout: float = 5.0,
        audit_timeout: float = DEFAULT_AUDIT_TIMEOUT,
        door: PromptDoor | None = None,
    ) -> None:
        super().__init__()
        if config.filtering and (classifier is None or audit is None):
            raise InvalidParams("filtering needs a classifier and an audit actor", data={"reason": "wiring"})
        self.config = config
        self.worker = worker
        self.ui = ui
        self.classifier = classifier
        self.audit = audit
        self.worker_timeout = worker_timeout
        self.classifier_timeout = classifier_timeout
        self.audit_timeout = audit_timeout
        self._quit_timer: CancelToken | None = None
        self._door = door

    def on_start(self) -> None:
        #: Held while the state is stepped and replaced (see "Completions"): handlers step it in
        #: the actor's turn, and a worker call's completion may step it on the thread that made
        #: the call, outside the turn.
        self._step_lock = threading.Lock()
        self.state = lc.initial_state(self.config)
        self._busy_since: float | None = None
        #: The footer the last prompt's step sent, while nothing else set the status since (see
        #: "The footer"): a prompt's equal footer is not sent again. None: the next one is sent.
        self._prompt_footer: lc.SetStatus | None = None
        self.describe_activity(self._describe)
        self._futures: dict[str, Answer] = {}
        self._cancels: dict[str, CancelToken] = {}
        self._current_model: tuple[str, str] | None = None
        handle = self.handle
        bound = ASK_GRACE + self.worker_timeout

        complete = self._complete

        def feed_back(done: lc.WorkerDone) -> None:
            # A completion whose step only answers its caller is applied here, on the thread
            # that made the call, under the step lock ("Completions" above): no ask at all.
            if complete(done):
                return
            # Else an ask, not a tell: an idle controller handles it on the lane thread, which then
            # resolves the caller's future itself (one hand-off fewer each way). The controller
            # never waits on the lane, so the lane waiting on the controller cannot deadlock.
            try:
                handle.ask(feedback(done), timeout=bound)
            except Timeout as exc:
                if not exc.may_have_started:  # withdrawn unhandled: deliver it queued instead
                    handle.tell(feedback(done))

        self._lane = WorkerLane(self.worker, self.worker_timeout, feed_back, owner=self.path)
        self._turn = handle.turn
        if self._door is not None:
            self._door.step = self.step_prompt  # last: everything it reads is set

    def on_terminate(self, cause: str) -> None:
        door = self._door
        if door is not None and getattr(door.step, "__self__", None) is self:
            door.step = None  # a client asks from now on (the next incarnation sets its own)
        timer = getattr(self, "_quit_timer", None)
        if timer is not None:
            timer.cancel()
        lane = getattr(self, "_lane", None)
        if lane is not None:
            lane.stop()
        # Copied first (one C call each): a completion applied outside the turn (_complete) may
        # pop its entry meanwhile.
        for token in list(getattr(self, "_cancels", {}).values()):
            token.cancel()
        futures = getattr(self, "_futures", {})
        for fut in list(futures.values()):
            if not fut.done():
                fut.set_result(None)
        futures.clear()

    # -- messages ---------------------------------------------------------

    @handles(HarnessEvent)
    def on_harness_event(self, msg: HarnessEvent) -> WorkerLane | None:
        """Step the event; the lane to help with its worker calls when its asker offered to
        (``helper``) and this runs on the asker's thread, else None."""
        event, helper, model = msg.event, msg.helper, msg.current_model  # each field read once
        self._futures[event.request] = msg.reply
        if model is not None:
            self._current_model = model
        helped = helper is not None and helper == threading.get_ident()
        self._apply(event, lane_wakes=not helped)  # a helping asker runs the calls: no wake-up
        return self._lane if helped else None

    def step_prompt(self, event: lc.BeforeAgentStart, reply: Answer, model: tuple[str, str] | None,
                    helped: bool) -> Any:
        """A prompt stepped on the asker's thread without an ask ("A prompt's own step" above): the
        lane to help with its retrieval (``helped``: the asker makes the call) or None; or
        :data:`NOT_TAKEN`, with nothing changed, when the ask path must take it."""
        mailbox, turn = self.inbox, self._turn
        if not mailbox.claim_idle(turn):  # the loop parked on an empty, open mailbox: this turn is ours
            return NOT_TAKEN
        failed: BaseException | None = None
        try:
            if self.is_ending or self.handle.faults.pending:
                return NOT_TAKEN  # ending, or a fault to inject into a handled message: the ask's
            with self._step_lock:
                try:
                    stepped = lc.prompt_step(self.state, event)
                except Exception:  # noqa: BLE001 - nothing changed: the ask steps it again, where a raise is a crash
                    return NOT_TAKEN
                if stepped is None:
                    return NOT_TAKEN  # not the commonest prompt: the general machine, in the turn
                # Registered before the state says it is in flight: whatever answers it from now
                # on (an /icarus off queued behind this turn, a completion) finds it.
                self._futures[event.request] = reply
                self.state, footer, call = stepped
            try:  # _apply's effects for (footer, CallWorker), inline
                if model is not None:
                    self._current_model = model
                if self._busy_since is None:
                    self._busy_since = time.monotonic()
                if footer is not self._prompt_footer:
                    self._set_status(footer, True)
                self._lane.submit(call.request, call.function, call.kwargs, wake=not helped)
            except BaseException as exc:  # noqa: BLE001 - an interrupt mid-step: crashed below, as a handler's raise
                failed = exc
        finally:
            mailbox.end_inline(turn)
        if failed is not None:
            # As a handler that raised: the incarnation crashes (its supervisor restarts it, a
            # snapshot shows it) and on_terminate answers every caller, this one included.
            self.log.opt(exception=failed).error("a prompt's step failed outside the turn")
            self.handle.kill(f"a prompt's step failed: {type(failed).__name__}")
            raise failed
        return self._lane if helped else None

    @handles(Feedback)
    def on_feedback(self, msg: Feedback) -> None:
        self._apply(msg.event)

    @handles(SetHooksEnabled)
    def on_set_enabled(self, msg: SetHooksEnabled) -> bool:
        self._apply(lc.SetEnabled(enabled=msg.enabled))
        return self.state.enabled

    @handles(SetContextVisible)
    def on_set_visible(self, msg: SetContextVisible) -> bool:
        self._apply(lc.SetVisible(visible=msg.visible))
        return self.state.visible

    @handles(HookStatus)
    def on_status(self, msg: HookStatus) -> HookStatusReply:
        s = self.state
        return HookStatusReply(enabled=s.enabled, visible=s.visible, generation=s.generation,
                               session_id=s.session_id, in_flight=len(s.inflight))

    def _describe(self) -> tuple[str, str, dict[str, Any], float, float | None] | None:
        """What the hooks are doing while a lifecycle call runs (read by snapshots; None when idle),
        with the deadline of the worker call running now, if one runs. Never the prompt or a
        memory's text: request ids and stages only."""
        inflight = self.state.inflight
        since = self._busy_since
        if not inflight or since is None:
            return None
        words = {("prompt", "worker"): "retrieving memories for a prompt",
                 ("prompt", "filter"): "filtering the retrieved memories (classifier)",
                 ("capture", "worker"): "capturing a finished turn into memory",
                 ("start", "worker"): "starting the Icarus session",
                 ("shutdown", "worker"): "ending the Icarus session"}
        items = sorted(inflight.items())
        said = Counter(words.get((f.kind, f.stage), f"{f.kind} ({f.stage})") for _, f in items)
        # the same words once, with how many (three prompts waiting are one line, not three)
        text = "; ".join(w if n == 1 else f"{w.removesuffix(' for a prompt')} for {n} prompts"
                         if w.endswith(" for a prompt") else f"{w} (x{n})" for w, n in said.items())
        lane = getattr(self, "_lane", None)
        queued = lane.queued if lane is not None else 0
        if queued:  # the lane's queue is no mailbox: its depth shows nowhere else
            text += f"; {queued} queued behind the running worker call"
        return "hook_call", text, {"requests": ", ".join(r for r, _ in items),
                                   "stages": ", ".join(f"{f.kind}:{f.stage}" for _, f in items),
                                   "queued": queued}, since, \
            lane.current_deadline if lane is not None else None

    # -- effects ------------------------------------------------------------

    def _apply(self, event: lc.Event, *, lane_wakes: bool = True) -> None:
        """Step ``event`` and carry out its effects. ``lane_wakes=False``: the asker runs the
        calls queued here itself (``WorkerLane.help_until``), so the lane's thread is not woken."""
        kind = type(event)
        if kind is lc.SessionStart:
            self._prompt_footer = None  # a (re)started session gets the footer at its next prompt
        with self._step_lock:  # a completion may step the state outside the turn (_complete)
            state = self.state
            nxt, effects = lc.step(state, event)
            self.state = nxt
        if nxt.generation != state.generation or kind is lc.TurnAborted:
            # Retrievals still queued whose prompt was just answered (nothing) are never sent:
            # their answer is ignored, a hung worker ahead of them would make a quit wait for
            # them too, and the backend would mark memories as injected that never were.
            self._lane.drop_answered("pre_llm_call", nxt.inflight)
        if nxt.inflight:  # what a snapshot shows meanwhile (see _describe)
            if self._busy_since is None:
                self._busy_since = time.monotonic()
        else:
            self._busy_since = None
        closing: list[Answer] | None = None
        for effect in effects:
            if type(effect) is lc.SetStatus:  # the commonest (a prompt's footer), first
                if kind is lc.BeforeAgentStart and effect is self._prompt_footer:
                    continue  # the prompt's footer the last prompt sent (_set_status's first check, inline)
                self._set_status(effect, kind is lc.BeforeAgentStart)
            elif type(effect) is lc.Reply and closing is None:  # a prompt's answer (_interpret's first branch, inline)
                fut = self._futures.pop(effect.request, None)
                self._cancels.pop(effect.request, None)
                if fut is not None:
                    fut.set_result(effect.result)  # ignored when answered already
            elif isinstance(effect, lc.CloseWorker):
                closing = []
                self._lane.submit_close(partial(_resolve_all, closing),  # bound now: a later close has its own list
                                        wake=lane_wakes)
            elif closing is not None and isinstance(effect, lc.Reply):
                # A reply that follows a close is given once the worker is closed.
                fut = self._futures.pop(effect.request, None)
                if fut is not None:
                    closing.append(fut)
            else:
                self._interpret(effect, lane_wakes)

    def _complete(self, done: lc.WorkerDone) -> bool:
        """Apply ``done`` here, outside the actor's turn, when its step's only effect is its
        caller's answer (a prompt's, a start's or a capture's commonest completion): True. Else
        nothing is changed and False: it goes to the actor as a message ("Completions" above)."""
        with self._step_lock:
            state = self.state
            answered = lc.prompt_answered(state, done)  # a prompt's commonest completion
            if answered is None:
                nxt, effects = lc.step(state, done)
                if len(effects) != 1 or type(effect := effects[0]) is not lc.Reply:
                    return False
                answered = nxt, effect
            nxt, reply = answered
            self.state = nxt
        if not nxt.inflight:
            self._busy_since = None  # for snapshots only (see _describe)
        fut = self._futures.pop(reply.request, None)  # one C call each: atomic in the GIL
        self._cancels.pop(reply.request, None)
        if fut is not None:
            fut.set_result(reply.result)  # ignored when answered already
        return True

    def _set_status(self, effect: lc.SetStatus, prompt: bool) -> None:
        """Send ``effect`` to the UI port, unless it is a prompt's footer (``prompt``) equal to the
        one the last prompt sent with nothing set since ("The footer" above)."""
        last = self._prompt_footer
        if prompt and last is not None and (last is effect or (last.key == effect.key and last.text == effect.text)):
            return
        self._prompt_footer = None
        try:
            self.ui.set_status(effect.key, effect.text)
        except Exception as exc:  # noqa: BLE001 - UI failures are swallowed
            self.log.bind(error=type(exc).__name__).debug("session ui call failed")
            return
        if prompt:
            self._prompt_footer = effect

    def _interpret(self, effect: lc.Effect, lane_wakes: bool) -> None:
        # The effect classes have no subclasses: their own class picks the branch, the commonest
        # first (a prompt's reply), not a chain of isinstance checks. A SetStatus never comes
        # here: _apply sends it (_set_status).
        if type(effect) is lc.Reply:
            fut = self._futures.pop(effect.request, None)
            self._cancels.pop(effect.request, None)
            if fut is not None and not fut.done():
                fut.set_result(effect.result)
        elif isinstance(effect, lc.CallWorker):
            if effect.function == "on_session_end":
                # The shutdown answered a retrieval still running (nobody waits for it now). The
                # session's end queues behind it on the same worker, which holds what the backend
                # gathered of the session (Icarus extracts its memories from it at the end); a
                # retrieval still running QUIT_GRACE_S later is stopped, its worker with it, so a
                # quit does not wait the rest of a hung one (the session's end then runs on a fresh
                # worker, without that state: logged).
                running = self._lane.running("pre_llm_call")
                if running is not None:
                    self._quit_timer = call_later(QUIT_GRACE_S, partial(self._stop_retrieval, running),
                                                  owner=self.path)
            self._lane.submit(effect.request, effect.function, effect.kwargs, wake=lane_wakes)
        elif isinstance(effect, lc.Filter):
            self._start_filter(effect)
        elif isinstance(effect, lc.CancelFilter):
            token = self._cancels.pop(effect.request, None)
            if token is not None:
                token.cancel()
        elif isinstance(effect, lc.SendMessage):
            self._ui(lambda: self.ui.send_message(effect.custom_type, effect.content,
                                                  display=effect.display, trigger_turn=effect.trigger_turn))
        elif isinstance(effect, lc.Log):
            self.log.bind(function=effect.function, code=effect.code).log(effect.level.upper(), effect.event)

    def _stop_retrieval(self, running: CancelToken) -> None:
        if self._lane.abandon_running("pre_llm_call", only=running):
            self.log.warning("the session ended while a memory retrieval still ran {s:g} s later: it was stopped "
                             "with its worker, so the session's end reached a fresh worker (what the old one "
                             "gathered of the session is not extracted)", s=QUIT_GRACE_S)

    def _ui(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - UI failures are swallowed
            self.log.bind(error=type(exc).__name__).debug("session ui call failed")

    def _start_filter(self, effect: lc.Filter) -> None:
        token = CancelToken()
        self._cancels[effect.request] = token
        job = _FilterJob(self, effect, token, self._current_model)
        start_thread(job.run, name="icarus-filter", owner=self.path, purpose="classify and release one prompt")


def _resolve_all(futures: list[Answer]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class _FilterJob:
    """Classify then audit, off the controller's thread; report ``FilterDone``."""

    def __init__(self, ctl: HookController, effect: lc.Filter, token: CancelToken,
                 current_model: tuple[str, str] | None) -> None:
        self.handle = ctl.handle
        self.classifier = ctl.classifier
        self.audit = ctl.audit
        self.ui = ctl.ui
        self.log = ctl.log
        self.classifier_timeout = ctl.classifier_timeout
        self.audit_timeout = ctl.audit_timeout
        self.effect = effect
        self.token = token
        self.current_model = current_model

    def run(self) -> None:
        text = self._filter()
        try:
            self.handle.tell(Feedback(event=lc.FilterDone(request=self.effect.request, text=text)))
        except CastorError:
            pass  # controller gone; callers were answered on its exit

    def _filter(self) -> str | None:
        ctx = self.effect.context
        assert self.classifier is not None and self.audit is not None
        try:
            deadline = time.monotonic() + self.classifier_timeout
            classified: Classified = self.classifier.ask(
                Classify(context=ctx, prompt=self.effect.prompt, deadline=deadline, cancel=self.token,
                         current_model=self.current_model),
                timeout=self.classifier_timeout + ASK_GRACE,
            )
            for notice in classified.notices:
                try:
                    self.ui.notify(notice, "warning")
                except Exception:  # noqa: BLE001 - a broken future callback must not stop the controller
                    pass
            released: Released = self.audit.ask(
                AuditAndRelease(original=ctx, result=classified.result, duration_ms=classified.duration_ms),
                timeout=self.audit_timeout + ASK_GRACE,
            )
            return released.text
        except Exception as exc:  # noqa: BLE001 - classifier/audit failure keeps the original
            self.log.bind(error=type(exc).__name__).warning("context filter failed; original context kept")
            return ctx


# ---------------------------------------------------------------------------
# Caller-side facade


class HookClient:
    """Blocking facade over a HookController handle (for the endpoint and tests)."""

    def __init__(self, handle: ActorHandle, *, default_timeout: float = 40.0,
                 door: PromptDoor | None = None) -> None:
        self.handle = handle
        self.default_timeout = default_timeout
        #: The controller's prompt step without an ask (the one the controller was made with), or
        #: one nobody opens (every event an ask).
        self._door = door if door is not None else PromptDoor()
        self._prefix = uuid.uuid4().hex[:8]
        self._ids = itertools.count(1)

    def new_request(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def submit(self, name: str, payload: dict[str, Any] | None = None, *,
               request: str | None = None) -> tuple[str, Answer]:
        """Send an event now; the returned ``Answer`` gets its result (or None). Raises InvalidParams at once."""
        req = request or self.new_request()
        data = payload or {}
        event = event_from_harness(name, data, req)
        fut = Answer()
        self.handle.tell(HarnessEvent(event=event, reply=fut, current_model=_current_model(data)))
        return req, fut

    def event(self, name: str, payload: dict[str, Any] | None = None, *, request: str | None = None,
              timeout: float | None = None,
              answer: Callable[[dict[str, Any] | None], None] | None = None) -> dict[str, Any] | None:
        """Send and wait. A caller-side timeout aborts the turn and returns None (ambient policy).

        The event is sent as an ask whose answer only says the controller took
        it (it never blocks), so a controller that crashes on this very message
        -- before it could register the reply -- answers None at once instead
        of leaving the caller to its deadline.

        ``answer``: how to answer the real caller before this returns (the endpoint's early
        answer). Given, it is called with the result as soon as there is one, on whichever thread
        settles it, and this thread makes the event's worker calls itself when the lane is idle
        (no hand-off to the lane's thread and back). An ``/icarus off``, a new session or an abort
        then still answers the caller at once -- through ``answer`` -- while this thread is inside
        the worker call; what this returns afterwards is the same result.
        """
        bound = self.default_timeout if timeout is None else timeout
        deadline = time.monotonic() + bound
        req = request or f"{self._prefix}-{next(self._ids)}"  # new_request, inline
        data = payload or {}
        # The early answer is the Answer's callback from the start: called on whichever thread
        # sets it, this one included while it asks (a prompt answered in its own step).
        fut = Answer(answer)
        event = event_from_harness(name, data, req)
        model = _current_model(data) if "model" in data else None
        lane: Any = NOT_TAKEN
        step = self._door.step
        try:
            if step is not None and type(event) is lc.BeforeAgentStart:
                lane = step(event, fut, model, answer is not None)  # an idle controller's, without an ask
            if lane is NOT_TAKEN:  # an idle controller handles it on this thread (inline_asks)
                lane = self.handle.ask(harness_event(event, fut, model,
                                                     None if answer is None else threading.get_ident()),
                                       timeout=bound)
        except Exception:  # noqa: BLE001 - crashed, stopped or timed out before handling: ambient None
            return fut.result(0) if fut.done() else None
        if answer is not None and isinstance(lane, WorkerLane):
            lane.help_until(fut, deadline)
        if fut.done():  # answered already (the commonest: this thread made the call): no clock, no wait
            answered: dict[str, Any] | None = fut.result(0)
            return answered
        try:
            result: dict[str, Any] | None = fut.result(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            self.abort(req)
            return None
        return result

    def abort(self, request: str) -> None:
        """The turn's abort signal for ``before_agent_start`` request ``request``."""
        try:
            self.handle.tell(Feedback(event=lc.TurnAborted(request=request)))
        except CastorError:
            pass

    def set_enabled(self, enabled: bool | None = None, timeout: float = 5.0) -> bool:
        enabled_now: bool = self.handle.ask(SetHooksEnabled(enabled=enabled), timeout=timeout)
        return enabled_now

    def set_visible(self, visible: bool | None = None, timeout: float = 5.0) -> bool:
        visible_now: bool = self.handle.ask(SetContextVisible(visible=visible), timeout=timeout)
        return visible_now

    def status(self, timeout: float = 5.0) -> HookStatusReply:
        reply: HookStatusReply = self.handle.ask(HookStatus(), timeout=timeout)
        return reply
